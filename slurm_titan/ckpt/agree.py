"""One verdict on a checkpoint for all nodes of a job, through the job folder (shared filesystem).

Each node restores its share of a candidate checkpoint, verifies it, and only then, before
publishing it under ``step-N``, says what it found in ``<folder>/step-N/`` and waits for every node's
verdict. An acceptance is a name, ``node-K.ok``; a rejection is ``node-K.json`` with its reason (whole, then
renamed into place, as the preflight exchange does: slurm_titan/doctor/exchange.py). So one listing a poll
decides (through the round's folder held open: no path walks), and only rejections are
read: on a shared file system, reading every node's verdict on every node cost M^2 reads of ~13 metadata
operations each (tools/bench/scale_sim/folder.py). If any node rejects the candidate (a bad range: file and
bytes named), every node falls back to the previous complete checkpoint; a node that does not report within
the timeout (it died) ends the restore on every node, so that no rank loads a checkpoint one
node rejected or never checked. The timeout allows for a node whose store throttles: it may wait
out the store for up to SLURM_TITAN_STORE_RETRY_S more (:mod:`.storage.backoff`).

A candidate saved by another world size has a round before that one (stage ``plan``, in
``<folder>/plan-N/``): whether every node holds its verified ``.metadata``, so that the ranks of every node
plan their load of it, or none do (planning runs collectives: torchtitan's fused-QKV state-dict hook gathers
over the data-parallel mesh; slurm_titan.ckpt.restore).
"""

from __future__ import annotations

import json
import time

from slurm_titan.ckpt.storage import Backoff
from slurm_titan.errors import StorageError
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.polls import poll_waits

DEFAULT_TIMEOUT_S = 900.0
"""How long a node waits for the others' verdicts, on top of the time each operation of a restore may spend
waiting out a throttling store (:class:`.storage.Backoff`'s total)."""
POLL_S = 0.2
MAX_POLL_S = 2.0
ACCEPTED, REJECTED = ".ok", ".json"
"""A node's verdict: its name says an acceptance; a rejection holds its reason."""
STAGES = ("plan", "step")
"""The rounds of a candidate, in their order: ``plan`` (resharding restores only), then ``step``, the verdict."""


class NodeAgreement:
    """``agree(step, why)`` for :func:`.catalog.restore`: this node's verdict out, the nodes' in.

    ``verdicts``: one folder per job attempt (``<job_dir>/attempts/<A>/restore``), held open by the caller, so that
    verdicts of an earlier attempt are never read and a round's folder is a lookup of one name."""

    def __init__(self, verdicts: HeldFolder, node: int, nodes: int, timeout_s: float | None = None,
                 poll_s: float = POLL_S) -> None:
        if not 0 <= node < nodes:
            raise ValueError(f"node {node} is not one of {nodes}")
        self.verdicts, self.node, self.nodes = verdicts, node, nodes
        self.timeout_s = DEFAULT_TIMEOUT_S + Backoff.from_env().total if timeout_s is None else timeout_s
        self.poll_s = poll_s

    def _round(self, step: int, stage: str) -> HeldFolder:
        """The round's folder (made when missing), held open for the round."""
        return self.verdicts.sub(f"{stage}-{int(step)}")

    def _say(self, round_dir: HeldFolder, verdict: dict) -> None:
        """This node's verdict: ``node-K.ok`` when it accepts (its name alone), else ``node-K.json`` with the
        reason."""
        if verdict.get("ok"):
            round_dir.create(f"node-{self.node}{ACCEPTED}")
        else:
            round_dir.replace_text(f"node-{self.node}{REJECTED}", json.dumps(dict(verdict, node=self.node)))

    def abort(self, step: int, why: str) -> None:
        """This node cannot restore at all (the store is unreachable, the disk is full): every node
        waiting on ``step``, in either round, stops at once instead of at the timeout."""
        for stage in STAGES:
            with self._round(step, stage) as round_dir:
                self._say(round_dir, {"ok": False, "fatal": True, "why": why})

    def __call__(self, step: int, why: str, stage: str = "step") -> str:
        """Why some node rejects ``step`` in round ``stage`` ("node K: ..."), or "" when every node accepts it."""
        with self._round(step, stage) as round_dir:
            self._say(round_dir, {"ok": not why, "why": why})
            return self._wait(step, round_dir)

    def _wait(self, step: int, round_dir: HeldFolder) -> str:
        deadline = time.monotonic() + self.timeout_s
        rejected: dict[int, dict] = {}
        waits = poll_waits(self.nodes, self.poll_s, MAX_POLL_S)  # a long wait (a slow node's restore) polls less
        while True:
            names = round_dir.names()  # one listing a poll; acceptances are names, only rejections are read
            accepted = run_folder.node_numbers(names, ACCEPTED)
            for k in run_folder.node_numbers(names, REJECTED) - rejected.keys():
                try:
                    rejected[k] = json.loads(round_dir.read_text(f"node-{k}{REJECTED}"))
                except (FileNotFoundError, ValueError):
                    pass
            fatal = sorted(k for k, v in rejected.items() if v.get("fatal"))
            if fatal:
                raise StorageError(f"node {fatal[0]} could not restore checkpoint step {step}: "
                                   f"{rejected[fatal[0]].get('why')}; the restore ends on every node")
            if rejected:  # one rejection is enough: no need to wait for the rest
                k = min(rejected)
                return f"node {k}: {rejected[k].get('why') or 'rejected'}"
            if len(accepted) == self.nodes:
                return ""
            if time.monotonic() > deadline:
                missing = [k for k in range(self.nodes) if k not in accepted]
                raise StorageError(f"{round_dir.path}: node(s) {missing} gave no verdict on checkpoint step {step} "
                                   f"within {self.timeout_s:.0f} s (died or cut off): no rank loads it; the restore "
                                   f"ends on every node")
            time.sleep(next(waits))
