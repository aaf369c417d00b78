"""`slurm-titan logs`: a job's node logs (submitit's per-task files) or one rank's log, optionally followed;
with `--stacks`, the ranks' stacks the watchdog took on a hang (the newest attempt that has them)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from slurm_titan import registry, slurm
from slurm_titan.errors import SlurmTitanError

FOLLOW_POLL_S = 1.0


def log_files(job_dir: Path, job_id: str, rank: int | None) -> list[Path]:
    if rank is not None:
        return [job_dir / "logs" / f"rank-{rank}.log"]
    return sorted(job_dir.glob(f"{job_id}_*_log.out"), key=lambda p: int(p.name.split("_")[1]))


def stacks_folder(job_dir: Path, attempt: int) -> Path:
    """Where the watchdog leaves the stacks of attempt `attempt` (node.watchdog)."""
    return job_dir / "attempts" / str(attempt) / "stacks"


def newest_stacks(job_dir: Path) -> list[Path]:
    """The stack files of the newest attempt that has any, by rank."""
    folders = [folder for folder in (job_dir / "attempts").glob("*/stacks") if folder.parent.name.isdigit()]
    for folder in sorted(folders, key=lambda f: int(f.parent.name), reverse=True):
        if files := sorted(folder.glob("rank-*.txt"), key=lambda p: int(p.stem.partition("-")[2] or 0)):
            return files
    return []


def show_stacks(job_id: str) -> int:
    record = registry.load(job_id)
    files = newest_stacks(record.folder)
    if not files:
        raise SlurmTitanError(f"no stacks for job {job_id} in {record.job_dir}: the watchdog saw no hang")
    for path in files:
        sys.stdout.write(f"==> attempt {path.parent.parent.name} {path.stem} ({path}) <==\n"
                         + path.read_text(errors="replace").rstrip("\n") + "\n")
    return 0


def _finished(job_id: str) -> bool:
    state = slurm.job_state(job_id)
    return state is None or state.state in slurm.FINISHED_STATES


def show(job_id: str, rank: int | None = None, follow: bool = False) -> int:
    record = registry.load(job_id)
    offsets: dict[Path, int] = {}
    while True:
        done = not follow or _finished(job_id)
        files = log_files(record.folder, job_id, rank)
        if not files and not follow:
            raise SlurmTitanError(f"no logs yet for job {job_id} in {record.job_dir}" + (f" for rank {rank}" if rank is not None else ""))
        for path in files:
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offsets.get(path, 0))
                chunk = handle.read()
                offsets[path] = handle.tell()
            if chunk:
                prefix = "" if len(files) == 1 else f"==> {path.name} <==\n"
                sys.stdout.write(prefix + chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
        if done:
            return 0
        time.sleep(FOLLOW_POLL_S)
