"""The RAM tier on the real local Slurm cluster (issue 25): snapshots in each node's own memory (a tmpfs private to
the node, gone with it) every 2 steps, replicated to the partner node; a crash or a lost node inside the allocation
resumes from the newest snapshot every rank can get. Each run is compared with the uninterrupted run of the same
16-step config (the RAM tier changes no loss): every step trained, every loss equal, COMPLETED, and the steps
trained twice at most the memory interval.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_titan.records import run_folder
from tests.support.cli import Cli, run, wait_for
from tests.support.references import SIXTEEN_STEPS
from tests.support.runs import assert_same_training, job_dir, job_field, wait_for_log
from tools.local_cluster.cluster import LocalCluster
from tools.local_cluster.faults import SignalAtStep, step_reached

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEPS = 16
INTERVAL = 2
MEMORY = ["--set", "checkpoint.memory.enable=true", "--set", f"checkpoint.memory.interval={INTERVAL}"]


@pytest.fixture
def reference(reference_losses) -> dict[int, str]:
    """The uninterrupted run of SIXTEEN_STEPS (shared with test_recovery and test_hang)."""
    return reference_losses(STEPS, *SIXTEEN_STEPS)


def node_logs(cli: Cli, job: str) -> str:
    return "\n".join(path.read_text(errors="replace") for path in run_folder.node_logs(job_dir(cli, job), job))


def test_a_killed_rank_resumes_from_the_ram_snapshot_of_the_step_before(cli: Cli, reference: dict[int, str]) -> None:
    job = cli.submit(*SIXTEEN_STEPS, *MEMORY, paced=True)
    folder = job_dir(cli, job)
    with SignalAtStep(folder, job, {"RANK": "1"}, step_reached(11), times=1) as fault:
        status = cli.wait(job, timeout=600)
    assert len(fault.signalled) == 1
    assert status["state"] == "COMPLETED", status
    assert job_field(cli, job, "Restarts") == 0
    first, second = status["attempts"][:2]
    assert (first["reason"], first["action"]) == ("failed", "restart")
    assert second["first_step"] == 11, second  # from step 10's snapshot: the store's newest was step 8
    assert first["steps_retrained"] <= INTERVAL, first
    logs = node_logs(cli, job)
    assert "resuming RAM snapshot step 10: every rank's copy from this node's memory" in logs
    assert_same_training(cli, job, reference)


@pytest.fixture
def healed_cluster(cluster: LocalCluster, slurm_env: dict) -> Iterator[LocalCluster]:
    """The cluster, brought back whole after the test (a killed node's slurmd restarted)."""
    yield cluster
    cluster.up()
    wait_for(lambda: set(run(["sinfo", "-h", "-o", "%t"], env=slurm_env).stdout.split()) <= {"idle", "mix", "alloc"},
             120, "every node back")


def test_a_lost_nodes_ranks_resume_on_the_spare_from_the_partners_memory(cli: Cli, healed_cluster: LocalCluster,
                                                                          reference: dict[int, str]) -> None:
    job = cli.submit(*SIXTEEN_STEPS, *MEMORY, "--set", "slurm.spare_nodes=1", paced=True)
    folder = job_dir(cli, job)
    wait_for_log(folder / "logs/rank-0.log", "step:  7")
    hosts = cli.status(job)["attempts"][0]["hosts"]
    assert healed_cluster.kill_node(hosts[1]) >= 3  # its memory goes with it
    status = cli.wait(job, timeout=600)
    assert status["state"] == "COMPLETED", status
    first, second = status["attempts"][:2]
    assert first["cause"] == f"node {hosts[1]} lost" and hosts[1] not in second["hosts"]
    assert job_field(cli, job, "Restarts") == 0
    # step 6 is in no store checkpoint (4, 8): the spare's rank 1 can only have it from its partner's memory
    assert second["first_step"] == 7, second
    assert first["steps_retrained"] <= INTERVAL, first
    assert f"this node's ranks' copies from {hosts[0]}'s memory" in node_logs(cli, job)
    assert_same_training(cli, job, reference)
