"""One rank's snapshot of one step in a node's memory, and what a node holds.

A snapshot folder (``step-N/rank-R``, :mod:`.layout`) holds the rank's DCP files and ``snapshot.json`` (its
:class:`Manifest`: run, step, rank, world size, every file's size), written last: a folder is complete when its
manifest names this run, step and rank and every file has its size. A folder appears under its name only complete
(:func:`seal` renames it into place), so a crash mid-snapshot leaves a hidden ``.rank-R.<pid>`` folder, never a
partial ``rank-R``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan.ram import layout


@dataclass(frozen=True)
class Manifest:
    """What a snapshot folder holds: ``run`` (the job and its config digest), ``step``, ``rank``, ``world_size``,
    every file's size by name."""

    run: str
    step: int
    rank: int
    world_size: int
    files: dict[str, int]

    @property
    def size(self) -> int:
        """The bytes of its files."""
        return sum(self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        """ValueError (one line naming ``where``) when ``text`` is not a manifest."""
        try:
            data = json.loads(text)
            return cls(run=str(data["run"]), step=int(data["step"]), rank=int(data["rank"]),
                       world_size=int(data["world_size"]), files={str(k): int(v) for k, v in data["files"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{where}: not a snapshot manifest ({e})") from None

    @classmethod
    def of_folder(cls, folder: Path, *, run: str, step: int, rank: int, world_size: int) -> Manifest:
        """The manifest of the files now in ``folder``."""
        files = {entry.name: entry.stat().st_size for entry in folder.iterdir()
                 if entry.is_file() and entry.name != layout.MANIFEST}
        return cls(run=run, step=step, rank=rank, world_size=world_size, files=files)

    def mismatch(self, *, run: str, step: int, rank: int, world_size: int) -> str:
        """Why this manifest is not the snapshot asked for ("" when it is)."""
        if self.run != run:
            return f"a snapshot of another run ({self.run}, not {run})"
        if (self.step, self.rank) != (step, rank):
            return f"a snapshot of step {self.step} rank {self.rank}, not step {step} rank {rank}"
        if self.world_size != world_size:
            return f"saved by {self.world_size} ranks, not {world_size}"
        return ""


def read_manifest(folder: Path) -> Manifest:
    """The manifest of ``folder``; FileNotFoundError without one, ValueError when it is not one."""
    path = folder / layout.MANIFEST
    return Manifest.from_json(path.read_bytes(), str(path))


def problem(folder: Path, *, run: str, step: int, rank: int, world_size: int) -> str:
    """Why ``folder`` is not a complete snapshot of (run, step, rank, world_size); "" when it is."""
    try:
        manifest = read_manifest(folder)
    except FileNotFoundError:
        return f"{folder}: no snapshot"
    except ValueError as error:
        return str(error)
    if why := manifest.mismatch(run=run, step=step, rank=rank, world_size=world_size):
        return f"{folder}: {why}"
    for name, size in manifest.files.items():
        try:
            actual = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{folder}: {name} is missing"
        if actual != size:
            return f"{folder}: {name} has {actual} bytes, its manifest says {size}"
    return ""


def seal(staging: Path, manifest: Manifest, final: Path) -> None:
    """Write ``manifest`` into ``staging`` (whole, then renamed) and rename ``staging`` to ``final``, replacing a
    folder of that name (an earlier attempt's snapshot of the same step)."""
    tmp = staging / f".{layout.MANIFEST}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, staging / layout.MANIFEST)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def holdings(root: Path, *, run: str, world_size: int) -> dict[int, list[int]]:
    """{step: ranks} of the complete snapshots under ``root``, newest step first."""
    held: dict[int, list[int]] = {}
    for step in reversed(layout.steps(root)):
        ranks = []
        for entry in layout.step_dir(root, step).iterdir():
            rank = layout.parse_rank(entry.name)
            if rank is not None and not problem(entry, run=run, step=step, rank=rank, world_size=world_size):
                ranks.append(rank)
        if ranks:
            held[step] = sorted(ranks)
    return held


def drop_steps(root: Path, keep: set[int]) -> list[int]:
    """Remove every step folder under ``root`` but those of ``keep``; returns the steps removed."""
    dropped = [step for step in layout.steps(root) if step not in keep]
    for step in dropped:
        shutil.rmtree(layout.step_dir(root, step), ignore_errors=True)
    return dropped
