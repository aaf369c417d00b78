"""Where a job's RAM snapshots live on a node: ``<dir>/slurm-titan-<job>.<requeue>/step-N/rank-R/``.

``dir`` is ``checkpoint.memory.dir`` (a tmpfs: ``/dev/shm`` by default). The folder is the job's and the
allocation's: a requeue (Slurm's restart count) starts a new one, since memory dies with the allocation. A rank
writes its snapshot into ``step-N/.rank-R.<pid>`` and renames it to ``rank-R`` once its manifest is in; a replica
received from the partner arrives the same way. ``replicated-R`` (the newest step of rank R the partner holds) is
written by the supervisor, ``safe`` (the newest step every rank holds twice) by the ranks.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "snapshot.json"
SAFE = "safe"
_STEP = re.compile(r"step-(\d+)$")
_RANK = re.compile(r"rank-(\d+)$")


def job_root(memory_dir: str, job_id: str, requeue: int) -> Path:
    """The folder of job ``job_id``'s snapshots in its ``requeue``-th allocation."""
    return Path(memory_dir) / f"slurm-titan-{job_id}.{requeue}"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{int(step)}"


def rank_name(rank: int) -> str:
    return f"rank-{int(rank)}"


def rank_dir(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / rank_name(rank)


def replicated_file(root: Path, rank: int) -> Path:
    """The newest step of ``rank`` whose replica the partner holds (written by the node supervisor)."""
    return root / f"replicated-{int(rank)}"


def parse_step(name: str) -> int | None:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def parse_rank(name: str) -> int | None:
    m = _RANK.match(name)
    return int(m.group(1)) if m else None


def steps(root: Path) -> list[int]:
    """The steps with a folder under ``root``, oldest first."""
    try:
        names = [entry.name for entry in root.iterdir()]
    except FileNotFoundError:
        return []
    return sorted(s for s in map(parse_step, names) if s is not None)


def read_step(path: Path) -> int | None:
    """The step number a one-number file holds; None when it is missing or not a number."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
