"""Rank 0 notes the first and last step of each attempt in the run history (for `status`), and the
step it trained last in `attempts/<A>/trained-step` (what `finish` counts as progress)."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_titan.records import history

_first_step_noted = False


def _target() -> tuple[Path, int] | None:
    job_dir, attempt = os.environ.get("SLURM_TITAN_JOB_DIR"), os.environ.get("SLURM_TITAN_ATTEMPT", "")
    if not job_dir or os.environ.get("RANK", "0") != "0":
        return None
    return Path(job_dir), int(attempt.rpartition(".")[2] or 0)


TRAINED_STEP_FILE = "trained-step"


def trained_step_path(job_dir: Path, attempt: int) -> Path:
    return job_dir / "attempts" / str(attempt) / TRAINED_STEP_FILE


def read_trained_step(job_dir: Path, attempt: int) -> int | None:
    """The last step attempt `attempt` trained, None if it trained none."""
    try:
        return int(trained_step_path(job_dir, attempt).read_text())
    except (OSError, ValueError):
        return None


def note_step(step: int, last: bool = False) -> None:
    """Called after every step: the trained step (one small file, replaced), and in the history only
    the attempt's first step and the run's last one."""
    global _first_step_noted
    target = _target()
    if target:
        path = trained_step_path(*target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(step))
        tmp.replace(path)
    if target and not _first_step_noted:
        _first_step_noted = True
        history.append_event(target[0], "first-step", target[1], step=step)
    if target and last:
        history.append_event(target[0], "last-step", target[1], step=step)


def note_stop(step: int, signal_name: str, committed: bool) -> None:
    target = _target()
    if target:
        history.append_event(target[0], "stopped", target[1], step=step, signal=signal_name, committed=committed)
