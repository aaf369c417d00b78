"""In each rank: the RAM tier's snapshots (:mod:`slurm_titan.ram`). Every ``checkpoint.memory.interval`` steps the
rank saves its whole training state (model, optimizer, lr scheduler, data loader position, train state, RNG) into
its node's memory folder, and on a recovery from memory loads it back.

A snapshot is the rank's own state only (its local tensor of every DTensor and its own copy of the rest: see
:mod:`.snapshot_files`), so it needs no other rank's files and loads on the same world size only, which is all a
recovery inside the allocation asks for. The node supervisor (:mod:`slurm_titan.node.supervisor.ram`) copies each
complete snapshot to the partner node and says so in ``replicated-R``; at each snapshot the ranks agree (one
all_reduce) on the newest step every rank holds twice, and drop their own older ones.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slurm_titan.envvars import RamEnv
from slurm_titan.ram import layout, snapshot
from slurm_titan.rank import snapshot_files
from slurm_titan.thread_priority import BACKGROUND_NICE, lower_thread_priority

log = logging.getLogger("slurm_titan.rank.ram_snapshot")
RNG = "slurm_titan.rng"
"""The key of the RNG states in a snapshot."""
PROBE_STEP = 4
"""With an automatic interval, the first of the PROBES snapshots that measure what one costs is taken at the attempt's
4th step (after its first steps' warm-up), or at the first step after it from which no store checkpoint falls
within the probes' steps (they would count its save and upload)."""
AFTER_PROBE = 2
"""The steps after a probe whose time beyond the median counts to its cost: the time it stops training, and what
its write and the node's copy to the partner take from the steps they run beside where the host's cores are busy."""
PROBES = 3
"""Probe snapshots, AFTER_PROBE + 1 steps apart; the cost is their median (one step's time varies by a good part of
a snapshot's cost)."""
_SPACING = AFTER_PROBE + 1
COST_SHARE = 0.02
"""The automatic interval keeps what snapshots cost training at or below this share of its time."""


def _device_rng() -> Any:
    """The accelerator's RNG module (torch.cuda, torch.npu) when one is in use, else None."""
    for name in ("npu", "cuda"):
        module = getattr(torch, name, None)
        if module is not None and module.is_available() and module.is_initialized():
            return module
    return None


def _rng_states() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if (device := _device_rng()) is not None:
        states["device"] = device.get_rng_state()
    return states


def _collective_device() -> str:
    if dist.get_backend() == "gloo":
        return "cpu"
    from torchtitan.tools.utils import device_module, device_type

    return f"{device_type}:{device_module.current_device()}"


class RamSnapshots:
    """This rank's snapshots in the node's memory folder (``env.root``).

    A snapshot stops training for the copy of the state to host memory only (:class:`.snapshot_files.Stager`: into
    buffers kept from one snapshot to the next, pinned on an accelerator); a thread of its own writes the copy into
    the folder (at :data:`slurm_titan.thread_priority.BACKGROUND_NICE`) and seals it. One snapshot is written at a
    time: the next waits for the one before."""

    def __init__(self, env: RamEnv, rank: int, world_size: int, store_interval: int = 0) -> None:
        self.root, self.interval, self.run = env.root, env.interval, env.run  # interval 0: auto (the probes)
        self.rank, self.world_size, self.store_interval = rank, world_size, store_interval
        self.last_blocked_s = 0.0
        self.cost_s = 0.0  # a snapshot's cost, the probes' median (auto interval)
        self.step_s: list[float] = []  # the durations of the steps before the interval is settled (auto)
        self.last_step_at: float | None = None
        self.steps_seen = 0  # steps trained by this process: the same on every rank
        self.probe_at: int | None = None  # steps_seen at the first probe (auto)
        self.probes_stopped_s: list[float] = []  # the time each probe stopped training (auto)
        self.stager = snapshot_files.Stager(accelerator=_device_rng() is not None)
        self.writer = ThreadPoolExecutor(1, "ram-snapshot-write", initializer=lower_thread_priority,
                                         initargs=(BACKGROUND_NICE,))
        self.pending: Future | None = None

    def due(self, step: int) -> bool:
        """Whether ``step`` is snapshotted (every rank answers the same); called once per step, after it."""
        now = time.monotonic()
        if not self.interval and self.last_step_at is not None:
            self.step_s.append(now - self.last_step_at)
        self.last_step_at = now
        self.steps_seen += 1
        if self.interval:
            return step > 0 and step % self.interval == 0
        if self.probe_at is None:
            if self.steps_seen >= PROBE_STEP and self._clear_of_store(step):
                self.probe_at = self.steps_seen
                return True
            return False
        since = self.steps_seen - self.probe_at
        return since < PROBES * _SPACING and since % _SPACING == 0

    def _clear_of_store(self, step: int) -> bool:
        """Whether no store checkpoint is saved from AFTER_PROBE steps before ``step`` to the last probe's
        AFTER_PROBE steps after it; with store checkpoints that close together, any step from the interval's worth
        after PROBE_STEP."""
        if not self.store_interval or self.steps_seen >= PROBE_STEP + self.store_interval:
            return True
        last = (PROBES - 1) * _SPACING + AFTER_PROBE
        return all((step + k) % self.store_interval for k in range(-AFTER_PROBE, last + 1))

    def settle_interval(self) -> int:
        """With an automatic interval, AFTER_PROBE steps after the last probe: the smallest interval whose snapshots
        cost training at most COST_SHARE of its time, a snapshot's cost being the median over the probes of the
        time the AFTER_PROBE steps after each took beyond the probe's own step (a baseline next to each probe: an
        attempt's first steps may run slow for reasons of their own, such as the next standby step's import), and
        at least the time a probe stopped training (the slowest rank's figure: one all_reduce MAX); 0 before and
        after that. Every rank calls it after every step."""
        if self.interval or self.probe_at is None:
            return 0
        first = self.probe_at - 1  # step_s[i] is the step that ends at steps_seen i + 2
        if len(self.step_s) < first + (PROBES - 1) * _SPACING + AFTER_PROBE:
            return 0
        own = [first - 1 + i * _SPACING for i in range(PROBES)]  # each probe's own step (trained before it)
        costs = [sum(max(0.0, self.step_s[index + k] - self.step_s[index]) for k in range(1, AFTER_PROBE + 1))
                 for index in own]
        step_s = statistics.median(self.step_s[index] for index in own)
        stopped = statistics.median(self.probes_stopped_s) if self.probes_stopped_s else 0.0
        self.cost_s = max(statistics.median(costs), stopped)  # it costs at least the time it stops training
        wanted = math.ceil(self.cost_s / (COST_SHARE * step_s)) if step_s > 0 else 1
        if dist.is_available() and dist.is_initialized():
            value = torch.tensor([wanted], dtype=torch.int64, device=_collective_device())
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            wanted = int(value.item())
        self.interval = max(1, wanted)
        return self.interval

    def _safe_step(self) -> int:
        """The newest step every rank's replica is complete of (all_reduce MIN of each rank's ``replicated-R``);
        -1 when some rank has none yet. A collective: every rank calls it at the same step."""
        mine = layout.read_step(layout.replicated_file(self.root, self.rank))
        mine = -1 if mine is None else mine
        if not dist.is_available() or not dist.is_initialized():
            return mine
        value = torch.tensor([mine], dtype=torch.int64, device=_collective_device())
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return int(value.item())

    def save(self, states: dict[str, Any], step: int) -> None:
        """Snapshot ``states`` (torchtitan's, flattened) as step ``step``: copied to host memory now, written and
        sealed in the background. Every rank calls it at the same step (the safe step, the newest every rank holds
        twice, is agreed with one all_reduce); own snapshots older than it are dropped first."""
        begin = time.monotonic()
        self.wait()
        safe = self._safe_step()
        if safe >= 0:  # before the new one is written: a node holds the safe step and the one being written, no more
            for older in layout.steps(self.root):
                if older < safe:
                    shutil.rmtree(layout.rank_dir(self.root, older, self.rank), ignore_errors=True)
            (self.root / layout.SAFE).write_text(str(safe))  # the supervisor drops the partner's older copies
        final = layout.rank_dir(self.root, step, self.rank)
        staging = final.parent / f".rank-{self.rank}.{os.getpid()}"
        staged = self.stager.stage({**states, RNG: _rng_states()})
        self.last_blocked_s = time.monotonic() - begin
        if not self.interval:
            self.probes_stopped_s.append(self.last_blocked_s)

        def write_and_seal() -> None:
            snapshot_files.write(staged, staging)
            manifest = snapshot.Manifest.of_folder(staging, run=self.run, step=step, rank=self.rank,
                                                   world_size=self.world_size)
            snapshot.seal(staging, manifest, final)

        self.pending = self.writer.submit(write_and_seal)

    def wait(self) -> None:
        """Until the snapshot being written is sealed (or failed: the log says so, and it is not sealed)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception as error:  # noqa: BLE001 - a failed snapshot is not sealed; the next one may be
                log.error("the RAM snapshot failed, not sealed: %s", error)

    def load(self, states: dict[str, Any], folder: Path) -> None:
        """Load this rank's snapshot in ``folder`` (``step-N/rank-R``, complete: the node checked it) into
        ``states`` in place, the RNG states with them."""
        rng = _rng_states()
        snapshot_files.load({**states, RNG: rng}, folder)
        torch.set_rng_state(rng["cpu"])
        if "device" in rng and (device := _device_rng()) is not None:
            device.set_rng_state(rng["device"])
