"""What a restore fetches: what a node wants of a checkpoint (:class:`Wanted`, built once by the caller) and,
for each candidate checkpoint, the plan that the fetcher executes (:class:`FetchPlan`).

A node wants the whole checkpoint, or its ranks' share (:mod:`.share`): on the world size that saved it
from the commit record's read maps, on another from what the ranks' own load plans read of the
candidate (asked through a :data:`NodePlanner`). The restore (:mod:`.restore`) turns that into one
:class:`FetchPlan` per candidate: which files whole, which pieces of which files (those of the
record's gathered object from it, in one GET), each verified against the record's checksums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from slurm_titan.ckpt.manifest import FileEntry, Manifest, Range, gathered_layout
from slurm_titan.ckpt.share import Share

Ranks = list[int] | Callable[[int], list[int]]
"""Global ranks, or a function of the saving world size giving them (``ckpt restore --node K --nodes N``)."""


NodePlanner = Callable[[str], dict[int, list[Range]] | None]
"""Given a folder holding a checkpoint's ``.metadata``: per rank of this node (of the world size that will load
it), the byte ranges its DCP load reads, worked out by that rank (node.supervisor's ``RankGroup.plan``);
None when some rank cannot tell (the whole checkpoint is then fetched)."""


Piece = tuple[int, int, str]
"""(offset, length, checksum) of part of a file: one of the record's blocks, or one of its spans."""


@dataclass(frozen=True)
class Wanted:
    """What a node wants of a checkpoint: all of it (:data:`WHOLE`), or what ``ranks`` read when they load it
    on ``world_size`` ranks. On the world size that saved it the record's read maps say what they read; on
    another, ``planner`` does. Without a read map or a planner the whole checkpoint is fetched."""

    ranks: Ranks | None = None
    """The loading ranks (None: the whole checkpoint, on the saving world size)."""
    world_size: int | None = None
    """The world size that will load it (None: the saving one)."""
    planner: NodePlanner | None = None
    """On another world size than the save's: what the ranks' loads read of a candidate."""

    def resharded_to(self, saved_by: int | None) -> int | None:
        """The world size that will load a checkpoint saved by ``saved_by`` ranks when it is another one (None:
        the same one, or either not known)."""
        return self.world_size if saved_by is not None and self.world_size not in (None, saved_by) else None


WHOLE = Wanted()
"""The whole checkpoint."""


@dataclass(frozen=True)
class FetchPlan:
    """The fetch of one candidate checkpoint: what (files whole, pieces of files), from where (the step's folder
    of the location; the pieces in :attr:`gathered` from the record's gathered object), verified how (against
    the record's checksums, in its :attr:`algorithm`: each whole file's, and each piece's own)."""

    manifest: Manifest
    """The candidate's commit record."""
    share: Share | None
    """What the local copy holds once fetched (None: all of it)."""
    whole: tuple[FileEntry, ...]
    """Files fetched whole."""
    pieces: tuple[tuple[FileEntry, tuple[Piece, ...]], ...]
    """Files fetched in part (the rest are holes): the pieces of each."""
    gathered: tuple[tuple[str, int, int, int], ...]
    """(path, offset, length, offset in the object) of the pieces the record's gathered object holds."""

    @classmethod
    def of(cls, m: Manifest, share: Share | None) -> FetchPlan:
        """The fetch of ``share`` of the checkpoint of record ``m`` (None: all of it)."""
        if share is None:
            return cls(m, None, tuple(m.files), (), ())
        pieces = tuple((f, tuple(p)) for f in m.files if f.path not in share.whole and (p := share.pieces(f)))
        return cls(m, share, tuple(f for f in m.files if f.path in share.whole), pieces, _gathered(m, share))

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def algorithm(self) -> str:
        return self.manifest.algorithm

    @property
    def nbytes(self) -> int:
        """Bytes moved out of the store."""
        return sum(f.size for f in self.whole) + sum(n for _, pieces in self.pieces for _, n, _ in pieces)

    def source(self, path: str) -> str:
        """The object of file ``path`` in the location."""
        return self.manifest.key(path)


def _gathered(m: Manifest, share: Share) -> tuple[tuple[str, int, int, int], ...]:
    """The spans of ``share`` that the record's gathered object holds, with where it holds them (none when the
    record has no such object)."""
    wanted = {(path, off, n) for path, spans in share.spans.items() for off, n in spans}
    if m.gathered is None or not wanted:
        return ()
    out, at = [], 0
    for path, off, n, _ in gathered_layout(m.files):
        if (path, off, n) in wanted:
            out.append((path, off, n, at))
        at += n
    return tuple(out)
