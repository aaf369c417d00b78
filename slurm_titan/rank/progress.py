"""Rank 0 notes the first and last step of each attempt in the run history (for `status`), and the
step it trained last in the attempt's trained-step file (what `finish` counts as progress)."""

from __future__ import annotations

import os

from slurm_titan.envvars import RankAttemptEnv
from slurm_titan.records import history

_first_step_noted = False


def _target() -> RankAttemptEnv | None:
    """Where rank 0 of a supervised attempt notes its steps; None on other ranks, or unsupervised."""
    return RankAttemptEnv.from_env() if os.environ.get("RANK", "0") == "0" else None


def note_step(step: int, last: bool = False) -> None:
    """Called after every step: the trained step (one small file, replaced), and in the history only
    the attempt's first step and the run's last one."""
    global _first_step_noted
    target = _target()
    if target:
        history.write_trained_step(target.job_dir, target.attempt, step)
    if target and not _first_step_noted:
        _first_step_noted = True
        history.append_event(target.job_dir, "first-step", target.attempt, step=step)
    if target and last:
        history.append_event(target.job_dir, "last-step", target.attempt, step=step)


def note_stop(step: int, signal_name: str, committed: bool) -> None:
    target = _target()
    if target:
        history.append_event(target.job_dir, "stopped", target.attempt, step=step, signal=signal_name,
                             committed=committed)
