"""A run outlives its jobs, on the real local Slurm cluster: a job of a run cancelled mid-run, the next job of the
run resumes by its name from the newest complete checkpoint, and the losses are an uninterrupted run's; meanwhile a
second job for the run is refused before it is submitted, from this login node (the run's job is running) and from
another one (the location's writer lease names its holder); a job of another login node for the same location that
passed its submit (the lease's holder had ended) is refused at its start while the run's next job holds the lease,
before any node starts; nothing is lost. Then the run is one run: one line of
`runs` with both jobs, `status RUN` and `report RUN` with both jobs' attempts in order, one TensorBoard run."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

from tests.support.cli import Cli
from tests.support.cli import run as run_command
from tests.support.references import SIXTEEN_STEPS
from tests.support.runs import step_losses, wait_for_log

pytestmark = [pytest.mark.cluster, pytest.mark.train]
RESUMED = re.compile(r"resuming complete checkpoint step (\d+) from (\S+):")
TENSORBOARD = ["--set", "torchtitan.args.metrics.enable_tensorboard=true"]


def _refused(cli: Cli, *args: str) -> str:
    """What `submit` said refusing a job (exit 2, nothing submitted)."""
    done = cli("submit", "--set", f"runs_dir={cli.runs}", "--set", f"checkpoint.remote={cli.remote}", *args,
               check=False)
    assert done.returncode == 2 and "submitted job" not in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_a_run_cancelled_mid_run_resumes_in_its_next_job_by_name(cli, reference_losses, slurm_env, s3_server,
                                                                tmp_path_factory):
    reference = reference_losses(16, *SIXTEEN_STEPS)
    run = f"run-{uuid.uuid4().hex[:8]}"
    location = cli.remote.format(name="debug-cpu", job_id=run)
    first = cli.submit(*SIXTEEN_STEPS, *TENSORBOARD, "--run", run, paced=True)
    folder = cli.job_dir(first)
    wait_for_log(folder / "logs/rank-0.log", "step:  1", timeout=600)  # training: RUNNING, the lease taken

    said = _refused(cli, *SIXTEEN_STEPS, "--run", run)
    assert f"run {run}: job {first} is RUNNING in Slurm and writes to {location}" in said
    other = Cli(slurm_env, tmp_path_factory.mktemp("another-login-node"), s3_server)
    said = _refused(other, *SIXTEEN_STEPS, "--resume", location, "--run", run)
    assert f"{location}: job {first} (run 0 on " in said and "writes here (RUNNING in Slurm)" in said

    wait_for_log(folder / "logs/rank-0.log", "checkpoint step 4 committed", timeout=600)
    cli("cancel", first)
    assert cli.wait(first)["state"] == "CANCELLED"
    # a job of another login node for the same location passes its submit (the lease's holder ended), held until
    # the run's next job holds the lease: then it is refused at its start, before any node starts
    rogue = other.submit(*SIXTEEN_STEPS, "--set", f"checkpoint.remote={location}", "--set", "slurm.extra.hold=true")
    second = cli.submit(*SIXTEEN_STEPS, *TENSORBOARD, "--run", run, paced=True)
    wait_for_log(cli.job_dir(second) / f"{second}_0_log.out", f"writer lease of {location} taken", timeout=300)
    run_command(["scontrol", "release", rogue], env=other.env)
    assert other.wait(rogue, timeout=300)["state"] == "FAILED"
    said = "".join(p.read_text() for p in other.job_dir(rogue).glob(f"{rogue}_0_log.*"))
    assert f"{location}: job {second} (run 0 on " in said and "writes here (RUNNING in Slurm)" in said, said
    assert not list(other.job_dir(rogue).glob("logs/rank-*.log")), "a rank of the refused job started"
    assert cli.wait(second, timeout=900)["state"] == "COMPLETED"

    node_log = (cli.job_dir(second) / f"{second}_0_log.out").read_text()
    assert f"writer lease of {location} taken" in node_log and f"job {first} ended (CANCELLED)" in node_log
    resumed = RESUMED.search(node_log)
    assert resumed and resumed.group(2) == location, node_log[-3000:]
    step = int(resumed.group(1))
    assert step < 16, f"the first job trained to the end (step {step}) before it was cancelled"
    for rank in range(2):
        before = dict(step_losses(folder / f"logs/rank-{rank}.log"))
        after = dict(step_losses(cli.job_dir(second) / f"logs/rank-{rank}.log"))
        assert step >= 4 and min(after) == step + 1 and max(after) == 16, (step, sorted(after))
        assert {s: before[s] for s in range(1, step + 1)} | after == reference, f"rank {rank}"
    assert cli("ckpt", "verify", location, "--all", "--quiet", timeout=300).returncode == 0
    _one_run(cli, run, first, second, folder, tmp_path_factory.mktemp("report") / "run.html")


def _one_run(cli: Cli, run: str, first: str, second: str, folder, page) -> None:
    """`runs`, `status RUN`, `report RUN` and TensorBoard show the run of the two jobs as one."""
    lines = [line for line in json.loads(cli("runs", "--json").stdout) if line["run"] == run]
    assert [(line["jobs"], line["state"], line["step"]) for line in lines] == [([first, second], "COMPLETED", 16)]
    status = json.loads(cli("status", run, "--json").stdout)
    assert [(info["job_id"], info["state"]) for info in status["jobs"]] == [(first, "CANCELLED"), (second, "COMPLETED")]
    assert [(t["job_id"], t["job_attempt"], t["attempt"]) for t in status["attempt_times"]] == [
        (first, 0, 0), (second, 0, 1)]
    assert status["attempt_times"][1]["queue_s"] > 0 and status["goodput"]["goodput"] is not None
    said = cli("report", run, "--out", str(page)).stdout
    assert said == f"report: {page}\n"
    text = page.read_text()
    assert f"run {run}: jobs {first} CANCELLED, {second} COMPLETED" in text and f"1 (job {second})" in text
    events = EventMultiplexer().AddRunsFromDirectory(str(folder / "dump/tb"))
    events.Reload()
    assert set(events.Runs()) == {run}  # the second job wrote where the first did
    assert {e.step for e in events.Scalars(run, "loss_metrics/global_avg_loss")} == set(range(1, 17))
