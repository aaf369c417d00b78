"""The bundled local Slurm cluster for the tests: fixtures `cluster` (a LocalCluster, brought up if it is not
healthy and left up) and `slurm_env` (this environment pointed at it); `TOOL`, its command line.

Under pytest-xdist every worker has a cluster of its own, so that one worker's node kills, preemptions and
queue checks never touch another's jobs: worker gw0 uses the default cluster (or SLURM_TITAN_CLUSTER_DIR's),
worker gwN its own state folder (that name + `-gwN`), ports 10 x N higher and id slot N mod SLOTS (4)
(tools/local_cluster/cluster.py: first_job_id)."""

from __future__ import annotations

import os
import shutil
from collections.abc import MutableMapping

import pytest

from tests.support.paths import REPO
from tools.local_cluster.cluster import DEFAULT_PORT, DEFAULT_STATE, SLOTS, LocalCluster, search_path

TOOL = REPO / "tools" / "local-cluster"
PORTS_PER_WORKER = 10  # slurmctld and a slurmd per node (5), with room


def worker_index(env: MutableMapping[str, str]) -> int:
    """This process's pytest-xdist worker number (gw3 -> 3), 0 outside xdist."""
    worker = env.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") else 0


def use_worker_cluster(env: MutableMapping[str, str]) -> None:
    """Point `env` (LocalCluster.from_env's variables) at this worker's own cluster; gw0 keeps the default."""
    index = worker_index(env)
    if index == 0:
        return
    env["SLURM_TITAN_CLUSTER_DIR"] = f"{env.get('SLURM_TITAN_CLUSTER_DIR') or DEFAULT_STATE}-gw{index}"
    env["SLURM_TITAN_CLUSTER_PORT"] = str(int(env.get("SLURM_TITAN_CLUSTER_PORT") or DEFAULT_PORT)
                                          + PORTS_PER_WORKER * index)
    env["SLURM_TITAN_CLUSTER_SLOT"] = str(index % SLOTS)


def pytest_configure(config: pytest.Config) -> None:
    use_worker_cluster(os.environ)


@pytest.fixture(scope="session")
def cluster() -> LocalCluster:
    """This worker's cluster (SLURM_TITAN_CLUSTER_DIR, or the default one), up."""
    if os.geteuid() != 0:
        pytest.skip("the local cluster needs root")
    if shutil.which("slurmctld", path=search_path(os.environ)) is None:
        pytest.skip("Slurm is not installed (tools/local-cluster install-deps)")
    shared = LocalCluster.from_env()
    if shared.status().code != 0:
        shared.up()
    return shared


@pytest.fixture(scope="session")
def slurm_env(cluster: LocalCluster) -> dict:
    """The environment that points Slurm's commands at the bundled cluster."""
    return dict(os.environ) | cluster.env()
