"""Preemption, requeue and time limits on the real local Slurm cluster (issue: zero lost steps).

Every interrupted run is compared with one uninterrupted run of the same config: the job ends
COMPLETED at the last step, no step is trained twice (the saved step is the step during which
the signal came), and every loss after the resume equals the uninterrupted run's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tests.support.cli import Cli, run, wait_for
from tests.support.runs import (
    checkpoints,
    job_dir,
    job_field,
    scontrol,
    step_losses,
    uninterrupted_losses,
    wait_for_log,
)

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEPS = 60  # long enough that a signal sent a few steps in (or <= 30 s after step 3, test d) lands mid-run
CONFIG = ["configs/debug_cpu.yaml", "--set", f"torchtitan.args.training.steps={STEPS}",
          "--set", "checkpoint.interval=100"]


@pytest.fixture(scope="module")
def reference(slurm_env: dict, s3_server, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    return uninterrupted_losses(Cli(slurm_env, tmp_path_factory.mktemp("reference"), s3_server), STEPS, *CONFIG)


def interrupted_run(cli: Cli, trigger: Callable[[str], None], *extra: str, at_step: int = 6) -> dict:
    """Submit, call `trigger(job)` once step `at_step` is logged, wait for the end; returns the status."""
    job = cli.submit(*CONFIG, *extra)
    wait_for_log(job_dir(cli, job) / "logs/rank-0.log", f"step: {at_step:2d}")
    trigger(job)
    return cli.wait(job, timeout=900)


def assert_zero_lost_steps(cli: Cli, status: dict, reference: dict[int, str], reasons: set) -> None:
    assert status["state"] == "COMPLETED", status
    attempts = status["attempts"]
    assert len(attempts) >= 2, attempts
    first, second = attempts[0], attempts[1]
    assert first["reason"] in reasons, first
    assert first["stopped_at_step"] is not None and second["first_step"] == first["stopped_at_step"] + 1
    for rank in (0, 1):
        losses = step_losses(job_dir(cli, status["job_id"]) / f"logs/rank-{rank}.log")
        assert [step for step, _ in losses] == list(range(1, STEPS + 1)), "a step was lost or trained twice"
        assert dict(losses) == reference, "losses after resume differ from the uninterrupted run"


def test_a_scontrol_requeue(cli: Cli, reference: dict[int, str]) -> None:
    status = interrupted_run(cli, lambda job: scontrol(cli, "requeue", job))
    assert_zero_lost_steps(cli, status, reference, {"requeued by Slurm", "preempted"})
    assert status["attempts"][0]["stop_signal"] == "SIGTERM"


def test_b_scancel_usr2(cli: Cli, reference: dict[int, str]) -> None:
    status = interrupted_run(cli, lambda job: run(["scancel", "--signal=USR2", job], env=cli.env))
    assert_zero_lost_steps(cli, status, reference, {"preempted"})
    assert status["attempts"][0]["stop_signal"] == "SIGUSR2"


def test_c_preempted_by_high_priority_partition(cli: Cli, reference: dict[int, str]) -> None:
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


def test_d_time_limit(cli: Cli, reference: dict[int, str]) -> None:
    # How fast a machine trains must not decide whether the limit lands mid-run, so the limit is
    # cut once step 3 is logged: to the next whole minute at least 70 s away, which is within
    # signal_seconds + slurmctld's 30 s look-ahead, so the --signal comes at its next check
    # (<= 30 s: steps 4-60 must take longer, > 0.55 s a step) with >= 40 s left. While the job
    # waits to rerun, the limit goes back up.
    job = cli.submit(*CONFIG, "--time", "00:10:00", "--set", "preemption.signal_seconds=100")
    wait_for_log(job_dir(cli, job) / "logs/rank-0.log", "step:  3")
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


def test_e_signal_during_upload_and_during_restore(cli: Cli, reference: dict[int, str]) -> None:
    def signal_twice(job: str) -> None:
        run(["scancel", "--signal=USR2", job], env=cli.env)  # step-5's upload is under way
        node_log = job_dir(cli, job) / f"{job}_0_log.out"
        wait_for_log(node_log, "attempt 1:", timeout=300)
        run(["scancel", "--signal=USR2", job], env=cli.env)  # the requeued run is restoring / starting

    job = cli.submit(*CONFIG[:-2], "--set", "checkpoint.interval=5")
    wait_for_log(job_dir(cli, job) / "logs/rank-0.log", "Finished saving the checkpoint")
    signal_twice(job)
    status = cli.wait(job, timeout=900)
    assert status["state"] == "COMPLETED"
    assert [a["reason"] for a in status["attempts"]] == ["preempted", "preempted", "finished"]
    losses = step_losses(job_dir(cli, job) / "logs/rank-0.log")
    assert [step for step, _ in losses] == list(range(1, STEPS + 1))
    # interval 5 changes no loss: the schedule does not depend on checkpoints
    assert dict(losses) == reference
    complete = {c["step"] for c in checkpoints(cli, cli.remote.format(name="debug-cpu", job_id=job)) if c["complete"]}
    assert {5, status["attempts"][0]["stopped_at_step"], STEPS} <= complete


@pytest.mark.parametrize(("first_nodes", "second_nodes"), [(2, 1), (1, 2)])
def test_f_resume_on_another_node_count(cli: Cli, first_nodes: int, second_nodes: int) -> None:
    first = cli.submit(CONFIG[0], "--nodes", str(first_nodes), "--set", "torchtitan.args.training.steps=6",
                       "--set", "checkpoint.interval=3")
    assert cli.wait(first)["state"] == "COMPLETED"
    remote = cli.remote.format(name="debug-cpu", job_id=first)
    second = cli.submit(CONFIG[0], "--nodes", str(second_nodes), "--set", "torchtitan.args.training.steps=9",
                        "--set", "checkpoint.interval=3", "--set", f"checkpoint.remote={remote}")
    status = cli.wait(second)
    assert status["state"] == "COMPLETED", status
    node_log = (job_dir(cli, second) / f"{second}_0_log.out").read_text()
    assert f"saved by {first_nodes} ranks on {second_nodes} ranks" in node_log
    assert "the data position is resharded by the data loader" in node_log
    rank_log = (job_dir(cli, second) / "logs/rank-0.log").read_text()
    assert f"data position resharded from {first_nodes} to {second_nodes} data-parallel ranks" in rank_log
    assert [step for step, _ in step_losses(job_dir(cli, second) / "logs/rank-0.log")] == [7, 8, 9]
