"""Which of several hung ranks is the stuck one: the order the supervisor's watchdog and the batch shell's
attribution share. A rank that does not run comes first, then one not waiting in a collective, then the one
that got least far (its step, then its phase within the step: counted, so no clock decides), and only then the
oldest progress. Only that last key compares clocks, and across nodes it decides only between ranks alike in all
the others (in synchronous training those stopped within the same step): the batch shell compares them on its own
clock (node.batch.attribution.on_one_clock), to the resolution of its sightings of the reports."""

from __future__ import annotations

from slurm_titan.records.rank_progress import Phase

_PHASE_ORDER = {phase.label: phase.value for phase in Phase}


def progress_position(hang: dict) -> tuple[int, int]:
    """How far the rank got: its step, then its phase (a rank saving step N is past one still training step N,
    and behind one training step N + 1, which rank_progress records as step N + 1)."""
    return int(hang["step"]), _PHASE_ORDER.get(str(hang["phase"]), 0)


def culprit_key(hang: dict) -> tuple:
    """Sort key of hang records (a node's ranks, or the nodes' reports): the stuck rank sorts first."""
    return not hang.get("frozen"), bool(hang.get("in_collective")), progress_position(hang), hang["since"]
