"""Which of several hung ranks is the stuck one: the order the supervisor's watchdog and the batch shell's
attribution share (a rank that does not run, then one not waiting in a collective, then the oldest progress)."""

from __future__ import annotations


def culprit_key(hang: dict) -> tuple:
    """Sort key of hang records (a node's ranks, or the nodes' reports): the stuck rank sorts first."""
    return (not hang.get("frozen"), bool(hang.get("in_collective")), hang["since"])
