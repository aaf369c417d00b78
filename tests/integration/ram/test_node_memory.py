"""The supervisors' RAM tier (node.supervisor.ram.NodeMemory) on real snapshot servers over loopback, one folder per
node as each node's memory: a step replicated around the ring, a lost node's ranks recovered onto a spare from its
partner, a node lost with its partner and a partner that answers with another run's snapshot sent to the store,
each said in one line; every node reaches the same verdict through the real agreement round; the copies to the
partner run at the background priority, and a failed attempt's node does not wait for one under way."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from slurm_titan.ckpt import NodeAgreement
from slurm_titan.node.spec import MemoryPlan
from slurm_titan.node.supervisor import ram
from slurm_titan.node.supervisor.ram import NodeMemory
from slurm_titan.ram import layout, snapshot
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.restore_verdict import RestoreVerdict
from slurm_titan.thread_priority import BACKGROUND_NICE

RUN = "4711:abc"


class Node:
    """One node of an attempt: its memory (a folder) and its supervisor's NodeMemory."""

    def __init__(self, tmp: Path, host: str, node: int, nodes: int, attempt: int, lines: list[str],
                 run: str = RUN) -> None:
        self.lines = lines
        self.memory = NodeMemory(MemoryPlan(2, str(tmp / host)), job_id="4711", requeue=0, run=run, world_size=nodes,
                                 node=node, nodes=nodes, procs_per_node=1, job_dir=tmp / "job", attempt=attempt,
                                 host="127.0.0.1", say=lambda line: lines.append(f"{host}: {line}"))
        self.memory.publish()

    def snapshot(self, step: int, rank: int, data: bytes) -> None:
        """What rank `rank`'s snapshot of `step` leaves in this node's memory."""
        staging = layout.step_dir(self.memory.root, step) / f".rank-{rank}.1"
        staging.mkdir(parents=True)
        (staging / "__0_0.distcp").write_bytes(data)
        snapshot.seal(staging, snapshot.Manifest.of_folder(staging, run=self.memory.run, step=step, rank=rank,
                                                           world_size=self.memory.world_size),
                      layout.rank_dir(self.memory.root, step, rank))


def recover_all(tmp: Path, nodes: list[Node], attempt: int, store_step: int | None = None,
                refuse: tuple[str, ...] = ()) -> list:
    """Every node's recovery at once, agreeing through the attempt's folder, as the supervisors do (`refuse`: each
    node's reason not to judge, "" for none)."""
    verdicts: list = [None] * len(nodes)

    def one(k: int) -> None:
        with HeldFolder(run_folder.restore_verdicts(tmp / "job", attempt)) as folder:
            agree = NodeAgreement(folder, k, len(nodes), timeout_s=30)
            verdicts[k] = nodes[k].memory.recover(store_step, agree, refuse[k] if refuse else "")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for node in nodes:
        node.memory.close(keep=True)
    return verdicts


def two_nodes_with_step_4_replicated(tmp: Path, lines: list[str]) -> tuple[Node, Node]:
    a, b = Node(tmp, "a", 0, 2, 0, lines), Node(tmp, "b", 1, 2, 0, lines)
    a.snapshot(4, 0, b"rank 0 of step 4"), b.snapshot(4, 1, b"rank 1 of step 4")
    a.memory.replicate_once(), b.memory.replicate_once()
    return a, b


def test_a_step_goes_around_the_ring_and_a_spare_takes_the_lost_nodes_copy_from_its_partner(tmp_path: Path) -> None:
    lines: list[str] = []
    a, b = two_nodes_with_step_4_replicated(tmp_path, lines)
    assert snapshot.holdings(a.memory.root, run=RUN, world_size=2) == {4: [0, 1]}
    assert layout.read_step(layout.replicated_file(b.memory.root, 1)) == 4
    assert any("step 4 copied to the partner 127.0.0.1: 16 bytes" in line for line in lines)
    a.memory.close(keep=True), b.memory.close(keep=False)  # b is lost: its memory with it
    survivor, spare = Node(tmp_path, "a", 0, 2, 1, lines), Node(tmp_path, "c", 1, 2, 1, lines)
    verdicts = recover_all(tmp_path, [survivor, spare], 1)
    assert verdicts == [RestoreVerdict(memory=str(layout.step_dir(survivor.memory.root, 4))),
                        RestoreVerdict(memory=str(layout.step_dir(spare.memory.root, 4)))]
    assert (layout.rank_dir(spare.memory.root, 4, 1) / "__0_0.distcp").read_bytes() == b"rank 1 of step 4"
    assert any(line.startswith("c: resuming RAM snapshot step 4: this node's ranks' copies from 127.0.0.1's memory")
               for line in lines)


def test_a_node_lost_with_its_partner_or_a_newer_store_checkpoint_sends_every_node_to_the_store(tmp_path: Path) -> None:
    lines: list[str] = []
    a, b = two_nodes_with_step_4_replicated(tmp_path, lines)
    b.snapshot(6, 1, b"rank 1 of step 6")  # step 6 only half taken
    a.memory.close(keep=False), b.memory.close(keep=True)  # a lost, and with it the only copy of rank 0's step 6
    c, b2 = Node(tmp_path, "c", 0, 2, 1, lines), Node(tmp_path, "b", 1, 2, 1, lines)
    assert recover_all(tmp_path, [c, b2], 1) == [RestoreVerdict(memory=str(layout.step_dir(c.memory.root, 4))),
                                                 RestoreVerdict(memory=str(layout.step_dir(b2.memory.root, 4)))]
    assert not layout.step_dir(b2.memory.root, 6).exists()  # the half-taken step is gone with the new timeline
    b2.memory.close(keep=False)  # and now b too: nobody holds rank 1's copies
    d, e = Node(tmp_path, "d", 0, 2, 2, lines), Node(tmp_path, "c", 1, 2, 2, lines)
    assert recover_all(tmp_path, [d, e], 2) == [None, None]
    assert ("RAM tier: no snapshot that every rank can get (steps held: 4; no node left holds rank(s) 1 of step 4: "
            "a node and its partner lost?)") in lines[-1]
    f, g = Node(tmp_path, "f", 0, 2, 3, lines), Node(tmp_path, "c", 1, 2, 3, lines)
    f.snapshot(4, 1, b"x"), g.snapshot(4, 0, b"y")
    f.memory.publish(), g.memory.publish()
    assert recover_all(tmp_path, [f, g], 3, store_step=8) == [None, None]
    assert "RAM tier: snapshot step 4 not taken (node 0: the store's step 8 is newer): restoring from the store" in \
        lines[-1]
    # a node that cannot list the store rejects in the round: the other does not wait for it
    h, i = Node(tmp_path, "h", 0, 2, 4, lines), Node(tmp_path, "i", 1, 2, 4, lines)
    h.snapshot(4, 0, b"x"), i.snapshot(4, 1, b"y")
    h.memory.publish(), i.memory.publish()
    assert recover_all(tmp_path, [h, i], 4, refuse=("", "the store cannot be listed (503)")) == [None, None]
    assert "RAM tier: snapshot step 4 not taken (node 1: the store cannot be listed (503))" in lines[-1]


def test_a_partner_that_answers_with_another_runs_snapshot_is_named_and_the_store_is_used(tmp_path: Path) -> None:
    lines: list[str] = []
    a, b = two_nodes_with_step_4_replicated(tmp_path, lines)
    a.memory.close(keep=True), b.memory.close(keep=False)
    survivor, spare = Node(tmp_path, "a", 0, 2, 1, lines), Node(tmp_path, "c", 1, 2, 1, lines)
    # after it said what it holds, a's copy of rank 1 turns out to be another run's (its memory reused, say)
    replica = layout.rank_dir(survivor.memory.root, 4, 1)
    manifest = snapshot.read_manifest(replica)
    (replica / layout.MANIFEST).write_text(snapshot.Manifest("999:other", 4, 1, 2, manifest.files).to_json())
    assert recover_all(tmp_path, [survivor, spare], 1) == [None, None]
    assert any(line.startswith("c: RAM tier: snapshot step 4 not taken (node 1: ") and "a snapshot of another run "
               "(999:other, not 4711:abc)" in line and line.endswith("restoring from the store") for line in lines)
    assert not layout.steps(spare.memory.root)  # nothing of it kept


def test_a_one_node_job_says_it_has_no_partner_and_keeps_its_own_copy(tmp_path: Path) -> None:
    lines: list[str] = []
    only = Node(tmp_path, "a", 0, 1, 0, lines)
    only.snapshot(4, 0, b"rank 0 of step 4")
    only.memory.start_replicating()
    only.memory.close(keep=True)
    assert lines == ["a: RAM tier: a one-node job has no partner: its snapshots are kept in this node's memory only"]
    only.memory.replicate_once()
    assert layout.read_step(layout.replicated_file(only.memory.root, 0)) == 4  # held once: the most it can be


def test_the_copies_to_the_partner_run_at_the_background_nice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copying = threading.Event()
    nice: list[int] = []

    def replicate_once(self: NodeMemory) -> None:
        nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        copying.set()

    monkeypatch.setattr(NodeMemory, "replicate_once", replicate_once)
    monkeypatch.setattr(ram, "REPLICATE_POLL_S", 0.01)
    node = Node(tmp_path, "a", 0, 2, 0, [])
    node.memory.start_replicating()
    assert copying.wait(10)
    node.memory.close(keep=False)
    assert nice[0] == min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + BACKGROUND_NICE)


def test_after_a_failure_the_node_does_not_wait_for_a_copy_to_the_partner_under_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pushing, pushed = threading.Event(), threading.Event()

    def replicate_once(self: NodeMemory) -> None:  # a push the partner is slow to take
        pushing.set()
        pushed.wait(30)

    monkeypatch.setattr(NodeMemory, "replicate_once", replicate_once)
    monkeypatch.setattr(ram, "REPLICATE_POLL_S", 0.01)
    node = Node(tmp_path, "a", 0, 2, 0, [])
    node.memory.start_replicating()
    assert pushing.wait(10)
    node.memory.close(keep=True)  # the ranks failed: the supervisor exits next, the push ends with it
    assert node.memory.replicator is not None and node.memory.replicator.is_alive()
    assert node.memory.root.is_dir()  # kept for the next attempt
    assert node.memory.folder.stat("none") is None  # open (closed: EBADF): the push may read the partner's holding
    pushed.set()
    node.memory.replicator.join(10)
