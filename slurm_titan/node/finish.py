"""The batch script's last word on an attempt: why it ended, and whether the job requeues itself.

Runs in the batch shell after srun returns (submitit's teardown lines). It reads every node's
report, decides with `outcome.decide`, records the attempt's end in the run history, then
either `scontrol requeue`s the job (a missing or failing scontrol is an error that says so,
never a silent non-requeue) or exits with the code Slurm should record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slurm_titan import history, slurm
from slurm_titan.node.outcome import Outcome, RequeuePolicy, decide
from slurm_titan.node.preemption import PREEMPTED_EXIT_CODE
from slurm_titan.node.supervisor import node_report_path, say

REQUEUE_FAILED_EXIT_CODE = 76
REQUEUE_TRIES = 5  # pauses 2, 4, 8, 16 s between them
TIME_LIMIT_MARGIN_S = 90  # slurmctld sends the --signal up to ~60 s earlier than asked


def attempt_exit_code(job_dir: Path, attempt: int, nodes: int, srun_exit_code: int) -> int:
    """Combine the node reports: a node's failure wins, then a checkpoint-to-stop, then success.

    A node without a report was killed before it could write one: the attempt failed.
    """
    codes = []
    for node in range(nodes):
        path = node_report_path(job_dir, attempt, node)
        if not path.is_file():
            return srun_exit_code or 1
        codes.append(json.loads(path.read_text())["exit_code"])
    failures = [code for code in codes if code not in (0, PREEMPTED_EXIT_CODE)]
    if failures:
        return failures[0]
    if PREEMPTED_EXIT_CODE in codes:
        return PREEMPTED_EXIT_CODE
    return srun_exit_code


def near_time_limit(job_id: str, signal_seconds: int) -> bool:
    """True if the job's end time is within the warning window: the signal meant the time limit."""
    left = slurm.time_left_seconds(job_id)
    return left is not None and left <= signal_seconds + TIME_LIMIT_MARGIN_S


def requeue(job_id: str, tries: int = REQUEUE_TRIES, pause_s: float = 2.0) -> None:
    """`scontrol requeue` the job; a failure (a busy slurmctld times out) is retried with growing
    pauses. Raises RuntimeError when scontrol is missing or every try failed. On success Slurm ends
    this batch shell, so a try that succeeded but did not answer is never repeated."""
    if shutil.which("scontrol") is None:
        raise RuntimeError(f"scontrol not found on PATH of {os.uname().nodename}: cannot requeue job {job_id}; "
                           "install slurm-client on the compute nodes")
    for tried in range(1, tries + 1):
        try:
            result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
            if result.returncode == 0:
                return
            error = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
        except subprocess.TimeoutExpired:
            error = "no answer within 60 s"
        if tried == tries:
            raise RuntimeError(f"scontrol requeue {job_id} failed {tries} times, last: {error}")
        say(f"scontrol requeue {job_id} failed ({error}); retrying in {pause_s:g} s")
        time.sleep(pause_s)
        pause_s *= 2


def failures_so_far(job_dir: Path) -> int:
    return sum(1 for attempt in history.read_attempts(job_dir) if attempt.reason == "failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--srun-exit-code", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--max-requeues", type=int, required=True)
    parser.add_argument("--max-failures", type=int, required=True)
    parser.add_argument("--signal-seconds", type=int, required=True)
    args = parser.parse_args(argv)
    job_id = os.environ["SLURM_JOB_ID"]
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    job_dir = Path(args.job_dir.replace("{job_id}", job_id))
    code = attempt_exit_code(job_dir, attempt, args.nodes, args.srun_exit_code)
    near_limit = code == PREEMPTED_EXIT_CODE and near_time_limit(job_id, args.signal_seconds)
    outcome: Outcome = decide(code, attempt, failures_so_far(job_dir), near_limit,
                              RequeuePolicy(args.max_requeues, args.max_failures))
    history.append_event(job_dir, "end", attempt, exit_code=code, reason=outcome.reason, requeue=outcome.requeue,
                         note=outcome.note)
    say(f"attempt {attempt} ended: {outcome.reason} (exit code {code})"
        + (f"; {outcome.note}" if outcome.note else "") + ("; requeueing" if outcome.requeue else ""))
    if not outcome.requeue:
        return code
    try:
        requeue(job_id)
    except RuntimeError as error:
        say(f"ERROR: {error}")
        history.append_event(job_dir, "requeue-failed", attempt, error=str(error))
        return REQUEUE_FAILED_EXIT_CODE
    time.sleep(60)  # scontrol requeue ends this batch shell; never report an exit code of our own
    return 0


if __name__ == "__main__":
    sys.exit(main())
