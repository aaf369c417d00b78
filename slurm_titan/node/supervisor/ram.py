"""The node supervisor's side of the RAM tier (:mod:`slurm_titan.ram`): serve, replicate, recover, clean up.

For one attempt, :class:`NodeMemory`:

- serves the node's memory folder to the job's other nodes (:class:`slurm_titan.ram.transfer.SnapshotServer`) and
  publishes what it holds, where it listens and its token in the attempt's folder (``ram/node-K.json``, collected by
  node 0 into one file: :mod:`slurm_titan.ram.exchange`);
- replicates: once every rank of the node has sealed a snapshot of a step, it pushes them to the partner (the next
  node of the attempt, a ring; at :data:`slurm_titan.thread_priority.BACKGROUND_NICE`) and writes ``replicated-R``;
  the ranks agree from those on the newest step every rank holds twice and drop their older ones; the supervisor
  drops the partner's older ones it holds;
- recovers: after a crash, a hang or a lost node inside the allocation, every node reads every node's holding (the
  collected file), works out the same :class:`slurm_titan.ram.choice.Choice` (the newest step every rank can get),
  fetches its ranks' copies it lacks from the nodes that hold them, and the nodes agree on it in one round
  (:class:`slurm_titan.ckpt.NodeAgreement`, stage ``ram``) before any rank loads it; a store checkpoint newer than
  it, or a copy that cannot be had whole, sends every node to the store instead, and the log says why in one line;
- cleans up: the folder goes at Slurm's warning signal (memory dies with the allocation: a preemption or the time
  limit is saved to the store) and when the node's ranks finished or stopped for a requeue; an earlier allocation's
  of the same job goes when the job lands here again; the batch shell removes what a failed job left
  (:mod:`slurm_titan.node.batch.memory`).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurm_titan.cpulist import format_cpu_list
from slurm_titan.envvars import RamEnv
from slurm_titan.node.spec import MemoryPlan
from slurm_titan.ram import layout, snapshot
from slurm_titan.ram.choice import Choice, Holding, choose, missing
from slurm_titan.ram.exchange import HoldingsExchange
from slurm_titan.ram.transfer import SnapshotServer, TransferError, pull, push
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.restore_verdict import RestoreVerdict
from slurm_titan.records.whole_file import replace_text
from slurm_titan.thread_priority import BACKGROUND_NICE, lower_thread_priority

REPLICATE_POLL_S = 0.5
Agreement = Callable[..., str]
"""``agree(step, why, stage=...)``: every node's verdict on a step (slurm_titan.ckpt.NodeAgreement)."""


class NodeMemory:
    """This node's RAM tier for one attempt of job ``job_id`` (``requeue``: Slurm's restart count)."""

    def __init__(self, plan: MemoryPlan, *, job_id: str, requeue: int, run: str, world_size: int, node: int,
                 nodes: int, procs_per_node: int, job_dir: Path, attempt: int, host: str,
                 say: Callable[[str], None]) -> None:
        self.plan, self.run, self.world_size = plan, run, world_size
        self.node, self.nodes, self.procs_per_node = node, nodes, procs_per_node
        self.ranks = list(range(node * procs_per_node, (node + 1) * procs_per_node))
        self.root, self.requeue, self.attempt = layout.job_root(plan.dir, job_id, requeue), requeue, attempt
        for earlier in range(requeue):  # what an earlier allocation of this job left here, killed outright
            shutil.rmtree(layout.job_root(plan.dir, job_id, earlier), ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.folder = HeldFolder(run_folder.ram_folder(job_dir, attempt))
        self.exchange = HoldingsExchange(self.folder, node, nodes)
        self.host, self.say = host, say
        self.server = SnapshotServer(self.root, run, world_size).start()
        self.pushed = -1
        self.stopping = threading.Event()
        self.replicator: threading.Thread | None = None
        self.partner: Holding | None = None
        self.last_error = ""  # said once, not at every retry

    def rank_env(self) -> dict[str, str]:
        return RamEnv(self.root, self.plan.interval, self.run).to_env()

    def publish(self) -> None:
        """Say what this node holds and where its server listens (before its ranks start)."""
        held = snapshot.holdings(self.root, run=self.run, world_size=self.world_size)
        self.exchange.publish(Holding(self.node, self.host, self.server.port, self.server.token, held))

    # -- recovery -------------------------------------------------------------------------------------------
    def recover(self, store_step: int | None, agree: Agreement | None, refuse: str = "") -> RestoreVerdict | None:
        """The verdict of a recovery from memory, or None (the line saying why is out) when the store is the
        one to restore from: no step that every rank can get, a newer store checkpoint (``store_step``), a copy
        that some node could not get whole, or this node's ``refuse`` (why it cannot judge). Every node reaches the
        same answer (``agree``: one round)."""
        holdings = self.exchange.gather()
        node_of = {rank: rank // self.procs_per_node for rank in range(self.world_size)}
        choice = choose(holdings, self.world_size, node_of)
        if choice is None:
            steps = sorted({s for h in holdings for s in h.held}, reverse=True)[:3]
            if steps:
                lacking = format_cpu_list(frozenset(missing(holdings, self.world_size, steps[0])))
                self.say(f"RAM tier: no snapshot that every rank can get (steps held: {', '.join(map(str, steps))}; "
                         f"no node left holds rank(s) {lacking} of step {steps[0]}: a node and its partner lost?): "
                         "restoring from the store")
            elif self.requeue or self.attempt:
                self.say("RAM tier: no snapshot in memory" + (" (a new allocation)" if self.requeue else "")
                         + ": restoring from the store")
            self._forget(None)
            return None
        newer = store_step is not None and store_step > choice.step
        why = refuse or (f"the store's step {store_step} is newer" if newer else "")
        fetched = 0
        if not why:
            try:
                fetched = self._fetch(choice, holdings)
            except TransferError as error:
                why = f"node {self.node}: {error}"
        if agree is not None:
            why = agree(choice.step, why, stage="ram")
        if why:
            self.say(f"RAM tier: snapshot step {choice.step} not taken ({why}): restoring from the store")
            self._forget(None)
            return None
        self._forget(choice.step)
        moved = choice.moved(node_of)
        sources = sorted({holdings[k].host for r, k in moved.items() if node_of[r] == self.node})
        self.say(f"resuming RAM snapshot step {choice.step}: "
                 + (f"this node's ranks' copies from {', '.join(sources)}'s memory ({fetched} bytes)"
                    if sources else "every rank's copy from this node's memory")
                 + "; no checkpoint read from the store")
        return RestoreVerdict(memory=str(layout.step_dir(self.root, choice.step)))

    def _fetch(self, choice: Choice, holdings: list[Holding]) -> int:
        """Bring this node's ranks' copies of ``choice.step`` it lacks from the nodes holding them; the bytes
        fetched. TransferError when one cannot be had whole."""
        fetched = 0
        for rank in self.ranks:
            source = holdings[choice.source[rank]]
            if source.node == self.node:
                if why := snapshot.problem(layout.rank_dir(self.root, choice.step, rank), run=self.run,
                                           step=choice.step, rank=rank, world_size=self.world_size):
                    raise TransferError(why)
                continue
            fetched += pull(source.host, source.port, source.token, self.root, run=self.run, step=choice.step,
                            rank=rank, world_size=self.world_size)
        return fetched

    def _forget(self, kept: int | None) -> None:
        """Drop every step but ``kept`` (all when None: the run goes on from the store), and what said which steps
        were replicated: this attempt's ring starts over."""
        snapshot.drop_steps(self.root, {kept} if kept is not None else set())
        for rank in self.ranks:
            layout.replicated_file(self.root, rank).unlink(missing_ok=True)
        (self.root / layout.SAFE).unlink(missing_ok=True)

    # -- replication ----------------------------------------------------------------------------------------
    def start_replicating(self) -> None:
        if self.nodes == 1:
            self.say("RAM tier: a one-node job has no partner: its snapshots are kept in this node's memory only")
        self.replicator = threading.Thread(target=self._replicate, name="ram-replicator", daemon=True)
        self.replicator.start()

    def _replicate(self) -> None:
        lower_thread_priority(BACKGROUND_NICE)
        while not self.stopping.wait(REPLICATE_POLL_S):
            try:
                self.replicate_once()
            except (TransferError, OSError, ValueError) as error:
                if str(error) != self.last_error:
                    self.say(f"RAM tier: could not copy a snapshot to the partner node (retrying): {error}")
                self.last_error = str(error)

    def replicate_once(self) -> None:
        """Push this node's newest sealed step not yet pushed to the partner; drop the partner's older copies."""
        for step in reversed(layout.steps(self.root)):
            if step <= self.pushed:
                break
            folders = [layout.rank_dir(self.root, step, rank) for rank in self.ranks]
            if any(snapshot.problem(f, run=self.run, step=step, rank=r, world_size=self.world_size)
                   for f, r in zip(folders, self.ranks)):
                continue
            if self.nodes > 1:
                partner = self._partner()
                if not all(rank in partner.held.get(step, ()) for rank in self.ranks):
                    begin = time.monotonic()
                    sent = sum(push(folder, partner.host, partner.port, partner.token) for folder in folders)
                    if self.pushed < 0:  # the attempt's first copy is said; the others are alike
                        self.say(f"RAM tier: step {step} copied to the partner {partner.host}: {sent} bytes in "
                                 f"{time.monotonic() - begin:.2f} s (the later copies are not said)")
            for rank in self.ranks:
                replace_text(layout.replicated_file(self.root, rank), str(step))
            self.pushed = step
            break
        safe = layout.read_step(self.root / layout.SAFE)
        if safe is not None:
            for step in layout.steps(self.root):
                if step >= safe:
                    break
                for entry in list(layout.step_dir(self.root, step).iterdir()):
                    if layout.parse_rank(entry.name) not in self.ranks:
                        shutil.rmtree(entry, ignore_errors=True)
                with_ranks = list(layout.step_dir(self.root, step).iterdir())
                if not with_ranks:
                    layout.step_dir(self.root, step).rmdir()

    def _partner(self) -> Holding:
        """The next node of the attempt's ring (its holding as published at the attempt's start)."""
        if self.partner is None:
            self.partner = self.exchange.read((self.node + 1) % self.nodes)
        return self.partner

    # -- the end --------------------------------------------------------------------------------------------
    def discard(self) -> None:
        """Slurm's warning (a preemption, the time limit): the run saves to the store and requeues, so the snapshots
        go now (in a thread: this runs in a signal handler), not after the ranks' save, which Slurm may cut short.
        Not on SIGTERM: srun sends it to the other nodes when one fails, and their snapshots are the recovery's."""
        if not self.stopping.is_set():
            self.stopping.set()
            threading.Thread(target=shutil.rmtree, args=(self.root, True), name="ram-discard", daemon=True).start()

    def close(self, keep: bool) -> None:
        """Stop serving and replicating; the folder stays only when ``keep`` (the ranks failed: the next attempt
        recovers from it). A copy to the partner still under way then is not waited for: the supervisor exits next,
        and the srun step's end, on every fault's path to the next step, would wait for a push at the background
        nice (~1 s seen); cut short, it is never sealed on the partner, and this node keeps its own copy. The attempt's
        folder, which that copy may still read (the partner's holding), then stays open until the process ends."""
        self.stopping.set()
        self.server.close()
        if keep and self.replicator is not None and self.replicator.is_alive():
            return
        if self.replicator is not None:
            self.replicator.join(30)
        self.folder.close()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
