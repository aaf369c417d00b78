"""Rank 0 notes the first and last step of each attempt in the run history (for `status`)."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_titan import history

_first_step_noted = False


def _target() -> tuple[Path, int] | None:
    job_dir, attempt = os.environ.get("SLURM_TITAN_JOB_DIR"), os.environ.get("SLURM_TITAN_ATTEMPT", "")
    if not job_dir or os.environ.get("RANK", "0") != "0":
        return None
    return Path(job_dir), int(attempt.rpartition(".")[2] or 0)


def note_step(step: int, last: bool = False) -> None:
    """Called after every step; writes only the attempt's first step and the run's last one."""
    global _first_step_noted
    target = _target()
    if target and not _first_step_noted:
        _first_step_noted = True
        history.append_event(target[0], "first-step", target[1], step=step)
    if target and last:
        history.append_event(target[0], "last-step", target[1], step=step)


def note_stop(step: int, signal_name: str, committed: bool) -> None:
    target = _target()
    if target:
        history.append_event(target[0], "stopped", target[1], step=step, signal=signal_name, committed=committed)
