"""Why an attempt ended, and whether the job goes back in the queue (a pure decision, unit-tested)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_titan.node.preemption import PREEMPTED_EXIT_CODE

PREFLIGHT_EXIT_CODE = 78  # EX_CONFIG: the node is not fit to run this job; never requeued
STORAGE_EXIT_CODE = 74  # EX_IOERR: checkpoint storage unreachable before training


@dataclass(frozen=True)
class RequeuePolicy:
    max_requeues: int
    max_failures: int


@dataclass(frozen=True)
class Outcome:
    reason: str  # finished | preempted | timed out | failed | preflight failed
    requeue: bool
    note: str = ""


def decide(exit_code: int, attempt: int, failures_so_far: int, near_time_limit: bool,
           policy: RequeuePolicy) -> Outcome:
    """Decide for attempt number `attempt` (0-based = requeues so far) that ended with `exit_code`."""
    if exit_code == 0:
        return Outcome("finished", False)
    if exit_code == PREFLIGHT_EXIT_CODE:
        return Outcome("preflight failed", False, "a node failed the preflight: never requeued")
    if exit_code == PREEMPTED_EXIT_CODE:
        reason = "timed out" if near_time_limit else "preempted"
    else:
        reason = "failed"
        if failures_so_far >= policy.max_failures:
            return Outcome(reason, False, f"exit code {exit_code}; max_failures={policy.max_failures} reached")
    if attempt >= policy.max_requeues:
        return Outcome(reason, False, f"max_requeues={policy.max_requeues} reached")
    return Outcome(reason, True)
