"""End to end on the bundled Slurm cluster: real submitit, real torchtitan on the CPU with gloo."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.support.cli import Cli, run
from tests.support.paths import REPO
from tests.support.references import TWELVE_STEP_GROUP
from tools.local_cluster.cluster import NODES

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEP = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)*loss:\s*([0-9.]+)")


def losses(log: Path) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(log.read_text(errors="replace"))}


def job_dir(status: dict) -> Path:
    return Path(status["job_dir"])


@TWELVE_STEP_GROUP
def test_two_nodes_train_and_complete(twelve_step_run) -> None:
    cli, job = twelve_step_run(2)  # configs/debug_cpu.yaml on its 2 nodes (shared: tests.support.references)
    status = cli.status(job)
    assert status["state"] == "COMPLETED", status
    folder = job_dir(status)
    rank0, rank1 = losses(folder / "logs/rank-0.log"), losses(folder / "logs/rank-1.log")
    assert len(rank0) >= 10 and rank0.keys() == rank1.keys()
    assert rank0[max(rank0)] < rank0[1] - 1.0, rank0
    node_logs = cli("logs", job).stdout
    assert "node 0/2" in node_logs and "node 1/2" in node_logs
    assert {"n1", "n2"} <= set(re.findall(r"\[slurm-titan (n\d) ", node_logs))
    assert re.search(r"Applied [1-9]\d* override\(s\)", cli("logs", job, "--rank", "1").stdout)
    assert [(a["exit_code"], a["first_step"], a["last_step"]) for a in status["attempts"]] == [(0, 1, max(rank0))]
    assert f"finished steps 1..{max(rank0)}" in cli("status", job).stdout


@TWELVE_STEP_GROUP
def test_four_nodes_train_and_complete(twelve_step_run) -> None:
    cli, job = twelve_step_run(4)  # the 4-node run test_restore_share resumes from (tests.support.references)
    status = cli.status(job)
    assert status["state"] == "COMPLETED", status
    for rank in range(4):
        assert sorted(losses(job_dir(status) / f"logs/rank-{rank}.log")) == list(range(1, 13))
    assert "world size 4" in cli("logs", job).stdout


def test_crashing_training_ends_failed(cli: Cli, tmp_path: Path) -> None:
    broken = tmp_path / "broken-dataset"
    broken.mkdir()
    (broken / "train.jsonl").write_text("this is not json\n")
    # no retry: a failure that repeats ends as a restart loop after three (test_recovery's restart-loop case)
    job = cli.submit("configs/debug_cpu.yaml", "--set", f"torchtitan.args.dataloader.dataset_path={broken}",
                     "--set", "preemption.max_failures=0")
    status = cli.wait(job)
    assert status["state"] == "FAILED", status
    assert "FAILED" in cli("status", job).stdout
    assert "exited with code" in cli("logs", job).stdout


def test_unknown_config_of_an_external_module_fails_at_node_start(cli: Cli) -> None:
    job = cli.submit("configs/debug_cpu.yaml", "--set", "torchtitan.module=torchtitan.models.llama3",
                     "--set", "torchtitan.config=llama3_nope")
    status = cli.wait(job, timeout=180)
    assert status["state"] == "FAILED"
    first_line = (job_dir(status) / f"{job}_0_log.out").read_text().splitlines()[0]
    assert first_line.startswith("slurm-titan: torchtitan config 'llama3_nope' not found")


def test_cancel_a_job_then_an_ended_one_and_an_unknown_one(cli: Cli) -> None:
    job = cli.submit("configs/debug_cpu.yaml")
    assert re.fullmatch(rf"cancelled job {job} \((PENDING|RUNNING|CONFIGURING)\)", cli("cancel", job).stdout.strip())
    assert cli.wait(job, timeout=60)["state"] == "CANCELLED"
    again = cli("cancel", job, check=False)
    assert (again.returncode, again.stderr) == (
        3, f"slurm-titan: job {job} has already ended (CANCELLED): nothing to cancel\n")
    unknown = cli("cancel", "999999999", check=False)
    assert (unknown.returncode, unknown.stderr) == (
        3, "slurm-titan: no job 999999999: neither scontrol nor sacct knows it\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "9"], f"slurm-titan: --nodes 9 exceeds partition 'low', which has {len(NODES)} node(s)"),
        (["--partition", "gpu"], "slurm-titan: unknown partition 'gpu'; the cluster has: high, low"),
    ],
)
def test_cluster_refusals_submit_nothing(cli: Cli, tmp_path: Path, args: list[str], message: str) -> None:
    before = run(["squeue", "-h", "-o", "%i"], env=cli.env).stdout
    result = cli("submit", "configs/debug_cpu.yaml", "--set", f"runs_dir={tmp_path}", *args, check=False)
    assert (result.returncode, result.stderr) == (3, f"{message}\n")
    assert run(["squeue", "-h", "-o", "%i"], env=cli.env).stdout == before
    assert not any(tmp_path.iterdir())


def test_missing_sbatch_is_named(cli: Cli) -> None:
    bin_dir = Path(os.__file__).parent  # any folder without Slurm's commands
    env = cli.env | {"PATH": str(bin_dir)}
    result = run([sys.executable, "-m", "slurm_titan.cli.main", "submit", "configs/debug_cpu.yaml"], env=env,
                 check=False, cwd=REPO)
    assert result.returncode == 3
    assert result.stderr.startswith("slurm-titan: sbatch not found on PATH")
