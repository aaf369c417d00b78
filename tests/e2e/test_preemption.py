"""Preemption, requeue and time limits on the real local Slurm cluster (issue: zero lost steps):
`scontrol requeue`, `scancel --signal=USR2` (mid-run, during an upload, during a restore), preemption by
a high-priority partition, a time limit. (A resume on another node count: test_reshard.)

Every interrupted run is compared with one uninterrupted run of the same config: the job ends
COMPLETED at the last step, no step is trained twice (the saved step is the step during which
the signal came), and every loss after the resume equals the uninterrupted run's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tests.support.cli import PACE_CPUS, Cli, run, wait_for
from tests.support.references import SIXTEEN_STEPS
from tests.support.runs import (
    checkpoints,
    job_field,
    scontrol,
    step_losses,
    wait_for_log,
)

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEPS = 16  # paced at >= 1 s a step: a signal sent a few steps in (or <= 30 s after step 3, test c) lands mid-run
CONFIG = SIXTEEN_STEPS
"""The 16-step run that test_recovery and test_hang fault (one reference for all three): its checkpoint every 4
steps changes nothing here, a stop resumes at the step after the one it saved, never at a periodic checkpoint."""


@pytest.fixture
def reference(reference_losses) -> dict[int, str]:
    """The uninterrupted run of CONFIG (shared with test_recovery and test_hang: tests.support.references)."""
    return reference_losses(STEPS, *CONFIG)


def interrupted_run(cli: Cli, trigger: Callable[[str], None], *extra: str, at_step: int = 6) -> dict:
    """Submit, call `trigger(job)` once step `at_step` is logged, wait for the end; returns the status."""
    job = cli.submit(*CONFIG, *extra, paced=True)
    wait_for_log(cli.job_dir(job) / "logs/rank-0.log", f"step: {at_step:2d}")
    trigger(job)
    return cli.wait(job, timeout=900)


def assert_zero_lost_steps(cli: Cli, status: dict, reference: dict[int, str], reasons: set) -> None:
    assert status["state"] == "COMPLETED", status
    attempts = status["attempts"]
    assert len(attempts) >= 2, attempts
    first, second = attempts[0], attempts[1]
    assert first["reason"] in reasons, first
    assert first["stopped_at_step"] is not None and second["first_step"] == first["stopped_at_step"] + 1
    assert_every_step_once(cli, status["job_id"], reference)


def assert_every_step_once(cli: Cli, job: str, reference: dict[int, str]) -> None:
    """Every rank trained steps 1..STEPS once each, with the uninterrupted run's losses."""
    for rank in (0, 1):
        losses = step_losses(cli.job_dir(job) / f"logs/rank-{rank}.log")
        assert [step for step, _ in losses] == list(range(1, STEPS + 1)), "a step was lost or trained twice"
        assert dict(losses) == reference, "losses after resume differ from the uninterrupted run"


def usr2(cli: Cli, job: str) -> None:
    run(["scancel", "--signal=USR2", job], env=cli.env)


def test_a_requeue_during_an_upload_usr2_during_the_restore_and_mid_run(cli: Cli, reference: dict[int, str]) -> None:
    """One job, stopped three times: `scontrol requeue` (SIGTERM) while step 4's upload is under way, USR2
    (`scancel --signal`) while the requeued run restores, USR2 again 3 steps into the next run. Each stop saves
    the step it came in, the next run resumes at the step after it, and every step is trained once."""
    job = cli.submit(*CONFIG, paced=True)
    folder = cli.job_dir(job)
    rank0, node_log = folder / "logs/rank-0.log", folder / f"{job}_0_log.out"
    wait_for_log(rank0, "Finished saving the checkpoint")  # step 4's upload is under way
    scontrol(cli, "requeue", job)
    wait_for_log(node_log, "attempt 1:", timeout=300)
    usr2(cli, job)  # the requeued run is restoring / starting
    wait_for_log(node_log, "attempt 2:", timeout=300)
    trained = len(step_losses(rank0))
    wait_for(lambda: len(step_losses(rank0)) >= trained + 3, 300, "3 steps of attempt 2")
    usr2(cli, job)
    status = cli.wait(job, timeout=900)
    assert status["state"] == "COMPLETED", status
    attempts = status["attempts"]
    assert attempts[0]["reason"] in {"requeued by Slurm", "preempted"}, attempts
    assert [a["reason"] for a in attempts[1:]] == ["preempted", "preempted", "finished"], attempts
    assert (attempts[0]["stop_signal"], attempts[2]["stop_signal"]) == ("SIGTERM", "SIGUSR2")
    ran = [a for a in attempts if a["first_step"] is not None]
    for before, after in zip(ran, ran[1:]):
        assert before["stopped_at_step"] is not None and after["first_step"] == before["stopped_at_step"] + 1
    assert_every_step_once(cli, job, reference)
    complete = {c["step"] for c in checkpoints(cli, cli.remote.format(name="debug-cpu", job_id=job)) if c["complete"]}
    assert {4, attempts[0]["stopped_at_step"], attempts[2]["stopped_at_step"], STEPS} <= complete


def test_b_preempted_by_high_priority_partition(cli: Cli, reference: dict[int, str]) -> None:
    preemptor: list[str] = []

    def preempt(job: str) -> None:
        preemptor.append(run(["sbatch", "--parsable", "-p", "high", "--exclusive", "-N4", "-J", "preemptor",
                               "-o", "/dev/null",
                              "--wrap", "sleep 5"], env=cli.env).stdout.strip())

    status = interrupted_run(cli, preempt)
    assert_zero_lost_steps(cli, status, reference, {"requeued by Slurm", "preempted"})
    # Slurm sends the --signal (preempt_send_user_signal) within the grace time, or SIGTERM when it
    # requeues the victim at once; either way the step in progress is saved.
    assert status["attempts"][0]["stop_signal"] in {"SIGUSR2", "SIGTERM"}
    assert "JobState=COMPLETED" in scontrol(cli, "show", "job", preemptor[0])


def test_c_time_limit(cli: Cli, reference: dict[int, str]) -> None:
    # How fast a machine trains must not decide whether the limit lands mid-run, so the limit is
    # cut once step 3 is logged: to the next whole minute at least 70 s away, which is within
    # signal_seconds + slurmctld's 30 s look-ahead, so the --signal comes at its next check
    # (<= 30 s: steps 4-16 take longer, paced at a third of the usual pace: >= 3 s a step) with >= 40 s
    # left. While the job waits to rerun, the limit goes back up.
    job = cli.submit(*CONFIG, "--time", "00:10:00", "--set", "preemption.signal_seconds=100", paced=True,
                     pace_cpus=PACE_CPUS / 3)
    wait_for_log(cli.job_dir(job) / "logs/rank-0.log", "step:  3")
    minutes = math.ceil((job_field(cli, job, "RunTime") + 70) / 60)
    scontrol(cli, "update", f"JobId={job}", f"TimeLimit={minutes}")

    def requeued() -> bool:
        state = scontrol(cli, "show", "job", job)
        assert "JobState=COMPLETED" not in state, "the job finished before the time-limit signal came"
        return job_field(cli, job, "Restarts") >= 1 and "JobState=PENDING" in state

    wait_for(requeued, 300, f"job {job} back in the queue", 0.5)
    scontrol(cli, "update", f"JobId={job}", "TimeLimit=10")
    status = cli.wait(job, timeout=900)
    assert_zero_lost_steps(cli, status, reference, {"timed out"})
