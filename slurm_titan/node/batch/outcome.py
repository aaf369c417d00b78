"""Why an attempt ended, and what the job does next (a pure decision, unit-tested).

An attempt is one srun step of the job: the first of each Slurm run, and every restart inside the
allocation after it. What follows an attempt:

- `stop`: the run ends (finished, a preflight failure, a cap reached, a restart loop); a preflight failure that
  a restart may clear (`attribution.preflight_failure`: a chip still held after a restart) is retried as a
  failure instead, so the caps below bound it;
- `requeue`: back through Slurm's queue (a preemption or the time limit: the allocation is going);
- `restart`: an unplanned failure; a new attempt inside the allocation when it still has enough
  healthy nodes, else a requeue without the bad nodes (`slurm_titan.node.batch.finish` chooses). Also a
  slow node's swap (`slow node`: the attempt saved and stopped so that the next one runs on a spare,
  node.batch.slow_watch), which is no failure: it counts against none of the caps below.

Unplanned failures are retried by default. What stops a loop is progress: a failed attempt that
trained no step beyond every earlier attempt's is "stalled"; `max_failures_without_progress` stalled
failures in a row (nvidia-resiliency-ext's "3 cycles without progress") end the run as a
`restart loop`. `max_failures` caps failed attempts over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_titan.errors import ExitCode
from slurm_titan.node.batch_spec import RetryPolicy

STOP, REQUEUE, RESTART = "stop", "requeue", "restart"
SLOW_NODE = "slow node"


@dataclass(frozen=True)
class RunSoFar:
    """What the decision needs of the run before this attempt, and whether this attempt progressed."""

    requeues: int  # Slurm's SLURM_RESTART_COUNT
    failures: int  # failed attempts before this one
    stalled_failures: int  # failed attempts without progress in a row just before this one
    progressed: bool  # this attempt trained a step beyond every earlier attempt's


@dataclass(frozen=True)
class Outcome:
    reason: str  # finished | preempted | timed out | failed | restart loop | preflight failed | slow node
    action: str  # STOP | REQUEUE | RESTART
    note: str = ""


def decide(exit_code: int, near_time_limit: bool, run: RunSoFar, policy: RetryPolicy,
           retry_preflight: bool = False, swapping: bool = False) -> Outcome:
    """Decide what follows an attempt that ended with `exit_code` (the node reports combined); a preflight failure
    is retried only with `retry_preflight` (a transient one after a restart). `swapping`: the batch shell
    stopped the attempt to swap a slow node, so its checkpoint-to-stop restarts (unless the time limit is near)."""
    if exit_code == 0:
        return Outcome("finished", STOP)
    if exit_code == ExitCode.PREFLIGHT and not retry_preflight:
        return Outcome("preflight failed", STOP, "a node failed the preflight: not retried")
    if exit_code == ExitCode.PREEMPTED and swapping and not near_time_limit:
        return Outcome(SLOW_NODE, RESTART, "saved and stopped to run on a spare node instead")
    if exit_code == ExitCode.PREEMPTED:
        reason = "timed out" if near_time_limit else "preempted"
        if run.requeues >= policy.max_requeues:
            return Outcome(reason, STOP, f"max_requeues={policy.max_requeues} reached")
        return Outcome(reason, REQUEUE)
    progress = "after progress" if run.progressed else "without progress"
    what = "a transient preflight failure" if exit_code == ExitCode.PREFLIGHT else f"exit code {exit_code}"
    if run.failures + 1 > policy.max_failures:
        return Outcome("failed", STOP, f"{what} {progress}; max_failures={policy.max_failures} reached")
    stalled = 0 if run.progressed else run.stalled_failures + 1
    if stalled >= policy.max_failures_without_progress:
        return Outcome("restart loop", STOP, f"{stalled} failed attempts in a row without progress "
                                             f"(max_failures_without_progress={policy.max_failures_without_progress})")
    return Outcome("failed", RESTART, f"{what} {progress}")
