import json

import pytest

from slurm_titan.doctor.facts import read_ephemeral_range
from slurm_titan.node.supervisor.rendezvous import RendezvousError, from_slurm_env, master_port
from tests.support.paths import DATA

RECORDED = json.loads((DATA / "slurm-env/local-3node.json").read_text())["tasks"]
EPHEMERAL = (32768, 60999)


def test_recorded_three_node_job_agrees_on_master_and_ranks() -> None:
    nodes = [from_slurm_env(env, procs_per_node=8, ephemeral=EPHEMERAL) for env in RECORDED]
    assert {n.master_addr for n in nodes} == {"n1"}
    assert len({n.master_port for n in nodes}) == 1
    assert [n.node_rank for n in nodes] == [0, 1, 2]
    ranks = [int(n.process_env(local)["RANK"]) for n in nodes for local in range(8)]
    assert ranks == list(range(24))
    assert {n.process_env(0)["WORLD_SIZE"] for n in nodes} == {"24"}
    assert nodes[1].process_env(3)["LOCAL_RANK"] == "3"


def test_master_is_first_host_of_a_mixed_nodelist() -> None:
    env = {"SLURM_JOB_NODELIST": "a-[01-02],n[1-3,7]", "SLURM_JOB_NUM_NODES": "6", "SLURM_NODEID": "5",
           "SLURM_JOB_ID": "4242"}
    node = from_slurm_env(env, procs_per_node=1)
    assert node.master_addr == "a-01"
    assert node.hosts[-1] == "n7"
    assert node.process_env(0)["RANK"] == "5"


def test_port_is_stable_across_requeue_and_outside_ephemeral_range() -> None:
    env = dict(RECORDED[0])
    first = from_slurm_env(env, 1, ephemeral=EPHEMERAL).master_port
    requeued = from_slurm_env(env | {"SLURM_RESTART_COUNT": "1"}, 1, ephemeral=EPHEMERAL).master_port
    assert first == requeued
    for job_id in range(0, 200_000, 997):
        port = master_port(job_id)
        assert 20000 <= port <= 29999
        assert not EPHEMERAL[0] <= port <= EPHEMERAL[1]


def test_port_inside_the_kernels_ephemeral_range_is_refused() -> None:
    env = dict(RECORDED[0])
    with pytest.raises(RendezvousError, match="ephemeral port range 15000-30000"):
        from_slurm_env(env, 1, ephemeral=(15000, 30000))


def test_reads_this_machines_ephemeral_range() -> None:
    low, high = read_ephemeral_range()
    assert 0 < low <= high <= 65535


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_JOB_NODELIST": None, "SLURM_NODELIST": None}, "SLURM_JOB_NODELIST is not set"),
        ({"SLURM_NODEID": None}, "SLURM_NODEID is not set"),
        ({"SLURM_NODEID": "7"}, "outside 0..2"),
        ({"SLURM_JOB_NUM_NODES": "4"}, "names 3"),
        ({"SLURM_JOB_ID": "x"}, "not an integer"),
        ({"SLURM_JOB_NODELIST": "n[1-3", "SLURM_NODELIST": None}, "unbalanced"),
    ],
)
def test_broken_slurm_environment_is_named(change: dict, message: str) -> None:
    env = {k: v for k, v in (RECORDED[0] | change).items() if v is not None}
    with pytest.raises(RendezvousError, match=message.replace("(", r"\(").replace(".", r"\.")):
        from_slurm_env(env, 1)
