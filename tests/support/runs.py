"""Helpers shared by the end-to-end tests: read training logs and steer a running job."""

from __future__ import annotations

import json
import re
from pathlib import Path

from slurm_titan.records import run_folder
from tests.support.cli import Cli, run, wait_for
from tools.local_cluster.cluster import NODES, LocalCluster

STEP = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)*loss:\s*([0-9.]+)")
FETCHED = re.compile(r"this node's share \(ranks (\d+)-(\d+)\) fetched: (\d+) of (\d+) bytes")  # a node log's restore


def step_losses(log: Path) -> list[tuple[int, str]]:
    """Every (step, loss) line of a rank log, in order, across attempts (loss kept as printed)."""
    return [(int(m.group(1)), m.group(2)) for m in STEP.finditer(log.read_text(errors="replace"))]


def node_log_text(cli: Cli, job_id: str) -> str:
    """Every node log of the job (submitit's, where the supervisors say what they do), one after the other."""
    return "\n".join(path.read_text(errors="replace") for path in run_folder.node_logs(cli.job_dir(job_id), job_id))


def memory_left(cluster: LocalCluster, job_id: str) -> list[str]:
    """The nodes whose memory still holds a RAM tier folder of the job (each node's own /dev/shm)."""
    return [node for node in NODES
            if (shm := cluster.node_path(node, "/dev/shm")) and list(shm.glob(f"slurm-titan-{job_id}.*"))]


def wait_for_log(path: Path, text: str, timeout: float = 300) -> None:
    wait_for(lambda: path.exists() and text in path.read_text(errors="replace"), timeout, f"{text!r} in {path}", 0.5)


def checkpoints(cli: Cli, location: str) -> list[dict]:
    return json.loads(cli("ckpt", "list", location, "--json").stdout)["checkpoints"]


def scontrol(cli: Cli, *args: str) -> str:
    return run(["scontrol", *args], env=cli.env).stdout


def job_field(cli: Cli, job_id: str, key: str) -> int:
    """A numeric field of `scontrol show job`: a count (Restarts=1) or a duration in seconds (RunTime=00:01:05)."""
    value = re.search(rf"\b{key}=(\S+)", scontrol(cli, "show", "job", job_id)).group(1)
    if ":" not in value:
        return int(value)
    days, _, clock = value.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def uninterrupted_losses(cli: Cli, steps: int, *config: str) -> dict[int, str]:
    """Run `config` to the end without faults; every step's loss (the reference of a faulted run)."""
    job = cli.submit(*config)
    assert cli.wait(job)["state"] == "COMPLETED"
    losses = step_losses(cli.job_dir(job) / "logs/rank-0.log")
    assert [step for step, _ in losses] == list(range(1, steps + 1))
    return dict(losses)


def assert_same_training(cli: Cli, job: str, reference: dict[int, str], ranks: int = 2) -> None:
    """Every step's loss on every rank equals the uninterrupted run's (a retrained step: its last loss)."""
    for rank in range(ranks):
        losses = dict(step_losses(cli.job_dir(job) / f"logs/rank-{rank}.log"))
        assert losses == reference, f"rank {rank}: losses differ from the uninterrupted run"


def assert_fetched_what_new_ranks_read(cli: Cli, job: str, nodes: int, per_node: int, total: int) -> None:
    """Every node of `job`, resumed on another world size, planned its ranks' DCP load and fetched less than the
    whole checkpoint (of `total` bytes): its share, for the ranks of the new world it holds."""
    for k in range(nodes):
        log = (cli.job_dir(job) / f"{job}_{k}_log.out").read_text()
        assert "resharded by DCP" in log, f"node {k}"
        m = FETCHED.search(log)
        assert m, f"node {k} did not restore a share"
        assert (int(m.group(1)), int(m.group(2))) == (k * per_node, (k + 1) * per_node - 1)  # the new world's ranks
        got, of = int(m.group(3)), int(m.group(4))
        assert of == total and got < total, f"node {k}"
