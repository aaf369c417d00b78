"""The bundled local Slurm cluster for the tests: fixtures `cluster` (a LocalCluster, brought up if it is not
healthy and left up) and `slurm_env` (this environment pointed at it); `TOOL`, its command line."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.paths import REPO
from tools.local_cluster.cluster import LocalCluster, search_path

TOOL = REPO / "tools" / "local-cluster"


@pytest.fixture(scope="session")
def cluster() -> LocalCluster:
    """The shared cluster (SLURM_TITAN_CLUSTER_DIR, or the default one), up."""
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
