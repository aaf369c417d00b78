"""A node's share of a checkpoint: the files and blocks its ranks' DCP load reads (torch-free).

On the world size that saved it, the commit record's read maps (each rank's part, :mod:`.parts`)
say, per rank, which byte ranges that rank's load reads; DCP's load planner worked them out on the
saving rank (:mod:`slurm_titan.rank.dcp_plan`). On another world size the node's new ranks work
them out with the same planner at restore time, from the candidate's ``.metadata`` (asked through
their gate: node.supervisor.restore). Either way a node needs only the union of its ranks' ranges, each widened
to the blocks that cover it (a block is the unit the record has a checksum for): :func:`reads_share`.
Files that are not DCP data (``.metadata``, anything torchtitan adds) are always fetched whole, and
so is a data file read in part whose record has no block checksums.

The restored step folder records what it holds, and for which ranks of which world size, in
``.slurm-titan/share.json``, with the size and block size of each file held in part; the blocks not
fetched are holes in sparse files, at the offsets DCP's FileSystemReader reads, and the rank's
checkpointer checks its own load plan against that file alone before torchtitan loads (the node
parses the commit record; its ranks do not).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from slurm_titan.ckpt.manifest import FileEntry, Manifest, ManifestError, Range, compact_json

SHARE_FILE = "share.json"
"""Inside ``<step>/.slurm-titan/`` of a restored folder that holds part of the checkpoint."""


@dataclass
class Share:
    ranks: list[int]
    whole: list[str] = field(default_factory=list)
    """Files fetched whole."""
    blocks: dict[str, list[int]] = field(default_factory=dict)
    """Files fetched in part: the blocks fetched (the rest are holes)."""
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Files fetched in part: the spans (offset, length) fetched outside those blocks."""
    world_size: int | None = None
    """The world size ``ranks`` belong to (None in records written before shares of another world size
    than the save's: the saving one)."""
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Files fetched in part: (size, block size) of each, so that :meth:`covers` needs no commit record
    (empty in share records written before: :meth:`with_files`)."""

    def pieces(self, f: FileEntry) -> list[tuple[int, int, str]]:
        """(offset, length, checksum) of what this share holds of a file fetched in part."""
        out = [(*f.block_span(b), f.blocks[b]) for b in self.blocks.get(f.path, [])]
        return sorted(out + [s for o, n in self.spans.get(f.path, []) if (s := f.span(o, n))])

    def nbytes(self, m: Manifest) -> int:
        """Bytes this share moves out of the store."""
        return sum(f.size if f.path in self.whole else sum(n for _, n, _ in self.pieces(f)) for f in m.files)

    def covers(self, path: str, offset: int, length: int) -> bool:
        """Whether bytes [offset, offset + length) of ``path`` are on local disk in this share."""
        if path in self.whole:
            return True
        if path not in self.files:
            return False
        held = merged([(path, o, n) for o, n in self.spans.get(path, [])])
        if any(o <= offset and offset + length <= o + n for _, o, n in held):
            return True
        size, block_size = self.files[path]
        if offset < 0 or length < 0 or offset + length > size:
            return False
        wanted = range(offset // block_size, -(-(offset + length) // block_size))
        return bool(self.blocks.get(path)) and set(wanted) <= set(self.blocks[path])

    def with_files(self, m: Manifest) -> Share:
        """This share with :attr:`files` filled in from its commit record (a share record written before)."""
        files = {f.path: (f.size, f.block_size) for f in m.files if f.path in self.blocks or f.path in self.spans}
        return dataclasses.replace(self, files=files)

    def joined(self, other: Share, m: Manifest) -> Share:
        """One share holding what this one and ``other`` (of ranks of the same world size) hold."""
        wanted: dict[str, set[int]] = {}
        spans: dict[str, set[tuple[int, int]]] = {}
        for share in (self, other):
            for f in m.files:
                blocks = set(range(len(f.blocks))) if f.path in share.whole else set(share.blocks.get(f.path, ()))
                if blocks or f.path in share.whole or f.path in share.spans:
                    wanted.setdefault(f.path, set()).update(blocks)
                    spans.setdefault(f.path, set()).update(share.spans.get(f.path, ()))
        ranks = sorted(set(self.ranks) | set(other.ranks))
        return _normalized(m, Share(ranks, world_size=self.world_size), wanted, spans)

    def to_json(self) -> bytes:
        return compact_json({"ranks": self.ranks, "world_size": self.world_size, "whole": sorted(self.whole),
                            "blocks": {p: b for p, b in sorted(self.blocks.items())},
                            "spans": {p: [list(s) for s in v] for p, v in sorted(self.spans.items())},
                            "files": {p: list(v) for p, v in sorted(self.files.items())}})

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Share:
        try:
            obj = json.loads(data)
            world = obj.get("world_size")
            return cls([int(r) for r in obj["ranks"]], [str(p) for p in obj["whole"]],
                       {str(p): [int(b) for b in bs] for p, bs in obj["blocks"].items()},
                       {str(p): [(int(o), int(n)) for o, n in v] for p, v in obj.get("spans", {}).items()},
                       None if world is None else int(world),
                       {str(p): (int(n), int(b)) for p, (n, b) in obj.get("files", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"{where}: not a share record ({e})") from None


def is_data(path: str) -> bool:
    """DCP data files (``*.distcp``): the only files a node may fetch in part or not at all."""
    return path.endswith(".distcp")


def node_ranks(node: int, nodes: int, world_size: int) -> list[int]:
    """The global ranks of node ``node`` of ``nodes`` (contiguous, as the launcher numbers them)."""
    if nodes < 1 or not 0 <= node < nodes:
        raise ValueError(f"node {node} is not one of {nodes} node(s)")
    if world_size % nodes:
        raise ValueError(f"{world_size} ranks do not split evenly over {nodes} nodes")
    per = world_size // nodes
    return list(range(node * per, (node + 1) * per))


def node_share(m: Manifest, reads: dict[int, list[Range]] | None, where: str) -> Share | None:
    """The share of the ranks (of the saving world size) whose loads read ``reads`` (their read maps:
    :func:`.parts.rank_reads`), or None when the record has none (the whole checkpoint is needed).
    ManifestError as :func:`reads_share`."""
    return None if reads is None else reads_share(m, reads, m.world_size, where)


def reads_share(m: Manifest, reads: dict[int, list[Range]], world_size: int, where: str) -> Share:
    """The share of the ranks (of ``world_size``) whose DCP loads read ``reads`` (per rank). ManifestError
    for a read of a file missing from the record or outside its file."""
    files = {f.path: f for f in m.files}
    wanted: dict[str, set[int]] = {}
    spans: dict[str, set[tuple[int, int]]] = {}
    for r, ranges in reads.items():
        for path, off, length in ranges:
            f = files.get(path)
            if f is None:
                raise ManifestError(f"{where}: rank {r} reads bytes {off}-{off + length} of {path}, a file "
                                    f"missing from the record")
            tiles = f.tiling_spans(off, length)
            if tiles:  # small items checksummed on their own: fetched exactly
                spans.setdefault(path, set()).update(tiles)
                wanted.setdefault(path, set())
            elif not f.block_size:  # a record without block checksums: only the whole file can be verified
                wanted[path] = set(range(len(f.blocks)))
            else:
                wanted.setdefault(path, set()).update(f.covering_blocks(off, length, where))
    return _normalized(m, Share(sorted(reads), world_size=world_size), wanted, spans)


def _normalized(m: Manifest, share: Share, wanted: dict[str, set[int]],
                spans: dict[str, set[tuple[int, int]]]) -> Share:
    """``share`` filled with the files its ranks read (``wanted``: the blocks of each, ``spans``: items
    fetched exactly): whole where that is all of a file (or it is not DCP data, or has no block
    checksums), blocks and the spans outside them otherwise."""
    for f in m.files:
        blocks = wanted.get(f.path)
        if not is_data(f.path) or (blocks is not None and (not f.block_size or len(blocks) == len(f.blocks))):
            share.whole.append(f.path)
            continue
        if blocks:
            share.blocks[f.path] = sorted(blocks)
        left = sorted(s for s in spans.get(f.path, ()) if not set(f.covering_blocks(*s)) <= (blocks or set()))
        if not blocks and sum(n for _, n in left) == f.size:  # read all of it, item by item
            share.whole.append(f.path)
            continue
        if left:
            share.spans[f.path] = left
        if f.path in share.blocks or f.path in share.spans:
            share.files[f.path] = (f.size, f.block_size)
    return share


def merged(ranges: list[Range]) -> list[Range]:
    """The same bytes as few ranges as possible (sorted; overlapping and adjacent ones joined)."""
    out: list[list] = []
    for path, off, length in sorted(ranges):
        if out and out[-1][0] == path and off <= out[-1][1] + out[-1][2]:
            out[-1][2] = max(out[-1][2], off + length - out[-1][1])
        else:
            out.append([path, off, length])
    return [(p, o, n) for p, o, n in out]


def describe_ranges(f: FileEntry, bad: list[tuple[int, int]]) -> str:
    """'bytes A-B (block K), ... fail their checksum' for the bad pieces of a file."""
    def one(off: int, n: int) -> str:
        block = f" (block {off // f.block_size})" if f.block_size and off % f.block_size == 0 and (
            n == f.block_size or off + n == f.size) else ""
        return f"bytes {off}-{off + n}{block}"

    more = f" and {len(bad) - 3} more range(s)" if len(bad) > 3 else ""
    return ", ".join(one(o, n) for o, n in bad[:3]) + more + " fail their checksum"
