"""Unplanned failures on the real local Slurm cluster: a crashed rank (its attempt's write that lands late fenced
off; the next attempt's step standing by: preemption.standby_step), a node that fails every time, a crash that
repeats (a restart loop), a lost node (replaced by a spare, requeued without it, or left out on fewer nodes with
preemption.allow_shrink), the batch host lost.
Faults are real SIGKILLs of the training processes and whole nodes killed by their own processes, from outside.

Every run that completes is compared with one uninterrupted run of the same config: every step trained,
every loss equal, the job COMPLETED. Four run with the RAM tier on (issue 25): a node whose rank is killed and a
node lost whole, each replaced by the spare, which resumes from the partner's memory; a node and its partner lost
together, replaced by two spares, which resume from the store inside the allocation (the snapshot is whole nowhere);
a lost node without a spare, requeued, which resumes from the store (memory dies with the allocation).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.ckpt import layout
from tests.support.cli import Cli, run, wait_for
from tests.support.references import RAM_INTERVAL, RAM_TIER, SIXTEEN_STEPS, remote_of
from tests.support.runs import (
    assert_same_training,
    job_field,
    memory_left,
    node_log_text,
    step_losses,
    wait_for_log,
)
from tests.support.s3 import S3Server
from tests.support.throttle import ThrottledS3
from tools.local_cluster.cluster import LocalCluster
from tools.local_cluster.faults import SignalAtStep, step_reached

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEPS = 16
CONFIG = SIXTEEN_STEPS


@pytest.fixture
def reference(reference_losses) -> dict[int, str]:
    """The uninterrupted run of CONFIG (test_recovery and test_hang share it: tests.support.references)."""
    return reference_losses(STEPS, *CONFIG)


def test_a_killed_rank_recovers_inside_the_allocation_and_its_late_write_overwrites_nothing(
        slurm_env: dict, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory,
        reference: dict[int, str]) -> None:
    # And fenced attempts (issue 27): attempt 0's upload of rank 1's step-8 shard is held in the network (the proxy
    # reads it whole and keeps it) when rank 1 is killed at step 11. Attempt 1 resumes from step 4 and commits step
    # 8; only then the held write lands, as a cut-off node's late write would (here an uploader cannot outlive its
    # rank: it dies with it): into attempt 0's own folder, overwriting nothing of the committed step.
    with ThrottledS3(s3_server) as proxy, Cli(slurm_env, tmp_path_factory.mktemp("late-write"), proxy) as cli:
        job = cli.submit(*CONFIG, "--set", f"checkpoint.endpoint_url={proxy.endpoint}", "--set",
                         "preemption.standby_step=true", paced=True)
        late = layout.data_key(8, layout.attempt_dir(envvars.attempt_id(job, 0)), "__1_0.distcp")
        proxy.configure(hold=re.escape(f"/{late}") + r"(\?|$)")
        folder = cli.job_dir(job)
        with SignalAtStep(folder, job, {"RANK": "1"}, step_reached(11), times=1) as fault:
            wait_for_log(folder / "logs/rank-0.log", "checkpoint step 8 committed", timeout=600)
            assert proxy.held()["waiting"], "attempt 0's write of step 8 was not in flight when attempt 1 committed"
            proxy.configure(hold="")
            wait_for(lambda: proxy.held()["released"], 60, "the held write released")
            status = cli.wait(job, timeout=900)
        assert {answer for _, answer in proxy.held()["released"]} == {200}  # the late write did land
        assert len(fault.signalled) == 1
        assert status["state"] == "COMPLETED", status
        assert job_field(cli, job, "Restarts") == 0, "recovered through the queue, not inside the allocation"
        first, second = status["attempts"][:2]
        assert (first["reason"], first["action"]) == ("failed", "restart")
        assert first["cause"] == f"crashed on {fault.signalled[0]['SLURMD_NODENAME']} rank 1 with SIGKILL"
        assert first["excluded"] == []  # a first failure without a spare: the node stays
        assert second["first_step"] == 5 and first["steps_retrained"] >= 6  # step 8 was not complete: from step 4
        # attempt 1 ran in the standby step started as attempt 0 trained: its ranks imported long before the kill
        logs = node_log_text(cli, job)
        assert "attempt 0 trains (a standby step): the next attempt's step started ahead" in logs, logs
        assert "attempt 1 on" in logs and "(in the step started ahead" in logs
        imported = (folder / "logs/rank-1.log").read_text()  # attempt 1's ranks imported at the background priority
        assert "a standby step's rank: torch and torchtitan imported at nice 19" in imported
        assert "a standby step's rank, adopted: it trains in a session of its own" in imported
        assert_same_training(cli, job, reference)
        shown = cli("status", job).stdout
        assert "crashed on" in shown and "restart" in shown
        remote = remote_of(cli, job)
        record = cli("ckpt", "show", remote, "8").stdout
        assert re.search(rf"^attempt: +{re.escape(envvars.attempt_id(job, 1))}$", record, re.M), record
        direct = Cli(slurm_env, tmp_path_factory.mktemp("direct"), s3_server)  # past the proxy
        assert direct("ckpt", "verify", remote, "--all", "--quiet", timeout=300).returncode == 0


def test_a_node_that_fails_every_time_is_swapped_for_a_spare_which_resumes_from_the_partners_memory(
        cli: Cli, cluster: LocalCluster, reference: dict[int, str]) -> None:
    # And the RAM tier (issue 25): the bad node's rank is killed -9 in step 5; its snapshot of step 4 (or, were that
    # one's copy to the partner cut short, of step 2) comes to the spare from the partner's memory
    job = cli.submit(*CONFIG, *RAM_TIER, "--set", "slurm.spare_nodes=1", paced=True)
    folder = cli.job_dir(job)
    wait_for_log(folder / "logs/rank-0.log", "step:  1")
    good, bad = cli.status(job)["attempts"][0]["hosts"][:2]
    with SignalAtStep(folder, job, {"SLURMD_NODENAME": bad}, step_reached(5)) as fault:
        status = cli.wait(job, timeout=900)
    assert status["state"] == "COMPLETED", status
    assert len(fault.signalled) == 1, "the bad node was used again"
    first, second = status["attempts"][:2]
    assert first["excluded"] == [bad] and bad not in second["hosts"]
    assert job_field(cli, job, "Restarts") == 0
    assert second["first_step"] in (3, 5) and first["steps_retrained"] <= RAM_INTERVAL, (first, second)
    assert (f"resuming RAM snapshot step {second['first_step'] - 1}: this node's ranks' copies from {good}'s memory"
            in node_log_text(cli, job))
    assert memory_left(cluster, job) == []  # the bad node's kept snapshots too (the batch shell's, at the end)
    assert_same_training(cli, job, reference)


def test_a_crash_at_the_same_step_every_time_stops_as_a_restart_loop(cli: Cli) -> None:
    # 2 stalled failures, not the default 3 (tests/unit/node/batch/test_outcome.py): one attempt fewer, the same path
    job = cli.submit(*CONFIG, "--set", "preemption.max_failures_without_progress=2", paced=True)
    with SignalAtStep(cli.job_dir(job), job, {"RANK": "0"}, step_reached(6)):
        status = cli.wait(job, timeout=1200)
    assert status["state"] == "FAILED", status
    last = status["attempts"][-1]
    assert last["reason"] == "restart loop" and "2 failed attempts in a row without progress" in last["note"]
    assert last["cause"].startswith("crashed on ") and last["trained_step"] in (5, 6)
    # rank 0's node failed twice: left out, and the requeued job was kept off it (ExcNodeList)
    once_excluded = [a["excluded"] for a in status["attempts"] if a["excluded"]][0]
    assert job_field(cli, job, "Restarts") >= 1
    assert once_excluded[0] not in status["attempts"][-1]["hosts"]
    assert "restart loop" in cli("status", job).stdout


@pytest.fixture
def healed_cluster(cluster: LocalCluster, slurm_env: dict) -> Iterator[LocalCluster]:
    """The cluster, whole before the test and brought back whole after it (a killed node's slurmd restarted):
    a test after one whose healing failed starts on a whole cluster all the same."""
    cluster.up()
    yield cluster
    cluster.up()
    wait_for(lambda: "idle" in run(["sinfo", "-h", "-o", "%t"], env=slurm_env).stdout.split()
             and set(run(["sinfo", "-h", "-o", "%t"], env=slurm_env).stdout.split()) <= {"idle", "mix", "alloc"},
             120, "every node back")


def _kill_nodes(cli: Cli, cluster: LocalCluster, nodes: list[int], *args: str,
                step: int = 7) -> tuple[str, Path, list[str], dict]:
    """Submit CONFIG (plus `args`), kill attempt 0's nodes `nodes` whole together once rank 0 logged `step`, wait
    for the end: (job, its folder, the killed hosts, the final status)."""
    job = cli.submit(*CONFIG, *args, paced=True)
    folder = cli.job_dir(job)
    wait_for_log(folder / "logs/rank-0.log", f"step: {step:2d}")
    hosts = [cli.status(job)["attempts"][0]["hosts"][node] for node in nodes]
    assert cluster.kill_nodes(*hosts) >= 3 * len(hosts)  # each one's slurmd, slurmstepd, supervisor, rank...
    status = cli.wait(job, timeout=600)  # ~2.5 min; within the test's own timeout, so that it says why
    assert status["state"] == "COMPLETED", status
    return job, folder, hosts, status


def _kill_a_node(cli: Cli, cluster: LocalCluster, node: int, *args: str,
                 step: int = 7) -> tuple[str, Path, str, dict]:
    """_kill_nodes of one node: (job, its folder, the killed host, the final status)."""
    job, folder, hosts, status = _kill_nodes(cli, cluster, [node], *args, step=step)
    return job, folder, hosts[0], status


def test_a_lost_node_is_replaced_by_the_spare_which_resumes_from_the_partners_memory(
        cli: Cli, healed_cluster: LocalCluster, reference: dict[int, str]) -> None:
    # The RAM tier (issue 25): the node is killed whole (its memory with it) once step 8 is trained, before its
    # snapshot is taken: the spare takes the lost node's snapshot of step 6 from the partner's memory. Step 6 is in
    # no store checkpoint (4, 8): the spare can have it from nowhere else.
    job, folder, lost, status = _kill_a_node(cli, healed_cluster, 1, *RAM_TIER, "--set", "slurm.spare_nodes=1",
                                             step=8)
    first, second = status["attempts"][:2]
    assert first["cause"] == f"node {lost} lost" and first["excluded"] == [lost]
    assert lost not in second["hosts"]
    assert job_field(cli, job, "Restarts") == 0
    assert second["first_step"] in (7, 9) and first["steps_retrained"] <= RAM_INTERVAL, (first, second)
    partner = status["attempts"][0]["hosts"][0]
    assert (f"resuming RAM snapshot step {second['first_step'] - 1}: this node's ranks' copies from {partner}'s "
            "memory") in node_log_text(cli, job)
    assert memory_left(healed_cluster, job) == []
    assert_same_training(cli, job, reference)


def test_a_node_and_its_partner_lost_together_fall_back_to_the_store(
        cli: Cli, healed_cluster: LocalCluster, reference_losses) -> None:
    # The RAM tier (issue 25) on 3 nodes with 2 spares, 10 steps: node 1 copies its snapshots to node 2, node 2 to
    # node 0. Nodes 1 and 2 are killed whole together once step 7 is trained: node 1's ranks' snapshot of step 6 is
    # in no memory left (its own and its partner's), so the spares restore every rank from the store's step 4,
    # inside the allocation, and the supervisors say why (rank 2's copy of step 6, on node 0, may be still on its
    # way there).
    three = ("--set", "slurm.nodes=3", "--set", "torchtitan.args.training.steps=10")
    job, _, lost, status = _kill_nodes(cli, healed_cluster, [1, 2], *RAM_TIER, *three,
                                       "--set", "slurm.spare_nodes=2")
    first, second = status["attempts"][:2]
    assert first["cause"] == f"nodes {', '.join(lost)} lost" and first["excluded"] == lost, first
    assert first["action"] == "restart" and job_field(cli, job, "Restarts") == 0
    assert not set(lost) & set(second["hosts"]) and len(second["hosts"]) == 3, second
    assert second["first_step"] == 5, second  # from the store's step 4: the snapshot of step 6 is not whole
    text = node_log_text(cli, job)
    assert re.search(r"RAM tier: no snapshot that every rank can get \(steps held: 6\b.*; no node left holds "
                     r"rank\(s\) 1(-2)? of step 6: a node and its partner lost\?\): restoring from the store",
                     text), text
    assert "resuming RAM snapshot" not in text
    assert memory_left(healed_cluster, job) == []
    assert_same_training(cli, job, reference_losses(10, *CONFIG, *three), ranks=3)


def test_a_lost_node_without_a_spare_requeues_the_job_without_it(cli: Cli, healed_cluster: LocalCluster,
                                                                 reference: dict[int, str]) -> None:
    # With the RAM tier on: memory dies with the allocation, so the requeued job resumes from the store, and says so
    job, folder, lost, status = _kill_a_node(cli, healed_cluster, 1, *RAM_TIER)
    first, second = status["attempts"][:2]
    assert first["cause"] == f"node {lost} lost" and first["action"] == "requeue"
    assert lost not in second["hosts"]
    assert f"kept {lost} off the requeued job (ExcNodeList)" in (folder / f"{job}_0_log.out").read_text()
    assert second["first_step"] == 5  # from the store's step 4
    assert "RAM tier: no snapshot in memory (a new allocation): restoring from the store" in node_log_text(cli, job)
    assert memory_left(healed_cluster, job) == []  # the first allocation's: cleared by its batch shell
    assert_same_training(cli, job, reference)


def test_a_lost_node_without_a_spare_shrinks_inside_the_allocation_when_allowed(cli: Cli,
                                                                             healed_cluster: LocalCluster) -> None:
    job, folder, lost, status = _kill_a_node(cli, healed_cluster, 1, "--set", "preemption.allow_shrink=true")
    assert job_field(cli, job, "Restarts") == 0, "went through the queue instead of going on in the allocation"
    first, second = status["attempts"][:2]
    assert first["cause"] == f"node {lost} lost" and first["action"] == "restart"
    assert len(second["hosts"]) == 1 and lost not in second["hosts"]
    assert "healthy nodes left in the allocation: going on with 1 (preemption.allow_shrink)" in \
        (folder / f"{job}_0_log.out").read_text()
    rank0 = folder / "logs/rank-0.log"
    assert "data position resharded from 2 to 1 data-parallel ranks" in rank0.read_text(errors="replace")
    assert second["first_step"] == 5  # resumed from the checkpoint of step 4, on one node
    assert step_losses(rank0)[-1][0] == STEPS


def test_the_batch_host_lost_whole_is_requeued_by_a_surviving_node(cli: Cli, healed_cluster: LocalCluster,
                                                                    reference: dict[int, str]) -> None:
    job, folder, batch_host, status = _kill_a_node(cli, healed_cluster, 0)
    assert job_field(cli, job, "Restarts") >= 1
    assert status["attempts"][0]["cause"] == f"node {batch_host} lost (the batch host)"
    assert batch_host not in status["attempts"][-1]["hosts"]
    assert_same_training(cli, job, reference)


def test_spares_that_do_not_fit_the_partition_are_cut_with_one_warning(cli: Cli) -> None:
    out = cli("submit", "--set", f"runs_dir={cli.runs}", "--set", f"checkpoint.remote={cli.remote}", *CONFIG,
              "--set", "slurm.spare_nodes=5")
    job = re.search(r"submitted job (\d+)", out.stdout).group(1)
    try:
        assert "slurm.spare_nodes=5 does not fit partition 'low' (5 nodes for 2 + spares); submitting with 3" \
            in out.stderr
        shown = run(["scontrol", "show", "job", job], env=cli.env).stdout
        assert re.search(r"\bNumNodes=5\b", shown), shown
    finally:
        run(["scancel", job], env=cli.env)
