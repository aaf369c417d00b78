"""torchtitan hook, in each rank: torchtitan's CheckpointManager replaced by :class:`SyncedCheckpointManager`.

Activate with ``--override.imports slurm_titan.rank.checkpointer.synced_checkpoints`` (the
log then says ``Applied 1 override(s)``). Besides torchtitan's own save and load it carries the rank's
per-step duties, since ``save`` is what torchtitan calls after every step:

- upload: after torchtitan's save of step N on this rank (node-local ``checkpoint.folder``) step N goes
  to the rank's uploader process (:class:`slurm_titan.ckpt.UploaderProcess`, outside training's GIL);
  training goes on while the files upload, and rank 0's uploader commits once every rank's are up;
- the agreed stop: every step, all ranks agree whether any got Slurm's warning signal, and then save
  and stop together (:mod:`slurm_titan.rank.preemption`);
- progress: each step and phase goes to the rank's progress record (the supervisor's watchdog reads
  it, with the chip's probe time on an accelerator: :mod:`slurm_titan.rank.device_probe`) and, from rank 0,
  to the run history (:mod:`slurm_titan.rank.progress`);
- the restore gate: before loading, the rank waits for the node's restore and answers its plan
  requests (:mod:`slurm_titan.rank.restore_gate`);
- the RAM tier: every ``checkpoint.memory.interval`` steps a snapshot of the rank's state into node memory, and a
  recovery that the node takes from memory loads it instead of a checkpoint (:mod:`slurm_titan.rank.ram_snapshot`).

Settings come from the environment: what the node supervisor sets
(:class:`slurm_titan.envvars.RankCheckpointEnv`; without a remote location nothing is uploaded;
local files go only once uploaded),
``envvars.CKPT_CLOSE_TIMEOUT`` (seconds ``close()`` waits for pending uploads; default: until done),
and the S3 credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ... (the endpoint: ``checkpoint.endpoint_url``,
else AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import Metadata
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.checkpointer import DATALOADER, MODEL, AsyncMode, CheckpointManager
from torchtitan.config import derive, override
from torchtitan.tools.logging import logger

from slurm_titan import envvars
from slurm_titan.ckpt import Range, TransferConfig, Uploader, UploaderProcess, UploadSettings
from slurm_titan.cpulist import format_cpu_list
from slurm_titan.errors import ConfigError
from slurm_titan.ram import layout as ram_layout
from slurm_titan.rank import device_probe, preemption, progress
from slurm_titan.rank.dcp_plan import check_share, folder_reads, load_reads, small_items
from slurm_titan.rank.ram_snapshot import AFTER_PROBE, COST_SHARE, PROBES, RamSnapshots
from slurm_titan.rank.replicated import shard_split_qkv, sharded
from slurm_titan.rank.restore_gate import wait_for_restore
from slurm_titan.records import rank_progress
from slurm_titan.records.rank_progress import Phase

log = logging.getLogger("slurm_titan.rank.checkpointer")


def _close_timeout() -> float | None:
    """envvars.CKPT_CLOSE_TIMEOUT in seconds; None (wait until done) when unset."""
    raw = os.environ.get(envvars.CKPT_CLOSE_TIMEOUT, "").strip()
    try:
        return float(raw) if raw else None
    except ValueError:
        raise ConfigError("environment", envvars.CKPT_CLOSE_TIMEOUT, f"not a number: {raw!r}") from None


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class SyncedCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager plus background upload and commit of every checkpoint."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    exclude_from_loading: list[str]  # set by torchtitan's __init__, from its config

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self.sync: Uploader | None = None
        self._sync_closed = False
        self._force_save = False
        self._reads: Callable[[object], tuple] | None = None  # the last save's read map and spans, from its metadata
        shard_split_qkv(kwargs.get("model_parts") or ())  # before torchtitan's ModelWrapper caches a state dict
        super().__init__(config, **kwargs)  # reads nothing of the checkpoint folder
        rank, world = _rank_world()
        self._start_uploader(config, rank, world)  # its child imports and opens the store while the node restores
        # the node restores the checkpoint folder while the model is built; on another world size it first
        # asks what this rank's load will read (torchtitan's states to load exist from here on)
        verdict = wait_for_restore(self._plan_load)
        rank_progress.enter(Phase.RESTORE)  # the watchdog: from here to the first step (torchtitan's load)
        ram = envvars.RamEnv.from_env() if self.enable and not self.load_only else None
        self.ram = RamSnapshots(ram, rank, world, store_interval=self.interval) if ram else None
        self._ram_restore = Path(verdict.memory) if verdict and verdict.memory and self.ram else None
        excluded = self._resharded_exclusions() if verdict and verdict.world_size_changed else None
        if excluded is not None and excluded != self.exclude_from_loading:
            self.exclude_from_loading = excluded
            logger.warning("slurm-titan: the world size changed since the checkpoint was saved: model and optimizer "
                           "are resharded; the data loader state is NOT loaded (data restarts from the beginning)")

    def _start_uploader(self, config: Config, rank: int, world: int) -> None:
        """This rank's uploader process (:attr:`sync`), started now and ready by its first checkpoint (the first
        submit waits for it); none when checkpoints are off, loaded only, or have no remote."""
        if not self.enable or self.load_only:
            return
        checkpoint = envvars.RankCheckpointEnv.from_env(default_keep_local=config.keep_latest_k)
        if checkpoint is None:
            log.info("%s is not set: checkpoints stay in %s only", envvars.CKPT_REMOTE, self.folder)
            return
        uploader = UploaderProcess(UploadSettings.from_rank_env(checkpoint, local_folder=os.path.abspath(self.folder),
                                                                rank=rank, world_size=world))
        self.sync = uploader
        retention, cpus = checkpoint.retention, checkpoint.upload_cpus
        log.info("checkpoints of %s are uploaded to %s in the background by process %d (keep %s local, %s remote; "
                 "on %s)", self.folder, uploader.location, uploader.pid, retention.keep_local or "all",
                 retention.keep_remote or "all", f"CPUs {format_cpu_list(cpus)}" if cpus else "training's CPUs")

    def _resharded_exclusions(self) -> list[str]:
        """What torchtitan must not load of a checkpoint saved by another world size: its
        ``exclude_from_loading`` and the data loader, unless that reshards its position
        (overrides.resharding_loader)."""
        resharding = getattr(self.states.get(DATALOADER), "reshards", False)
        if resharding or DATALOADER in self.exclude_from_loading:
            return self.exclude_from_loading
        return [*self.exclude_from_loading, DATALOADER]

    def _plan_load(self, folder: str) -> list[Range]:
        """The byte ranges this rank's load reads of the checkpoint whose ``.metadata`` is in ``folder``, saved
        by another world size (the node's restore asks at the gate): DCP's planner on the states that
        torchtitan's ``_load`` will hand to :meth:`dcp_load`."""
        kept, self.exclude_from_loading = self.exclude_from_loading, self._resharded_exclusions()
        try:
            states = self._states_to_load(model_only=False)
        finally:
            self.exclude_from_loading = kept
        return folder_reads(sharded(states), folder)

    # -- preemption: every step boundary -------------------------------------------------
    def save(self, curr_step: int, last_step: bool = False) -> bool:
        """torchtitan calls this after every step. All ranks first agree whether any got a stop
        signal (one all_reduce); if so they save this step, wait for its commit and exit so that
        the job requeues (see slurm_titan.rank.preemption). The watchdog hears of every step here."""
        rank_progress.step_done(curr_step, device_probe.tick())
        progress.note_step(curr_step, last_step)
        if last_step or not preemption.agreed_stop():
            saved = super().save(curr_step, last_step)
            if self.ram is not None and not last_step:
                self._ram_step(curr_step)
            return saved
        request = preemption.stop_requested()
        reason = request.signal_name if request else "another rank's signal"
        logger.info(f"slurm-titan: stop requested ({reason}) during step {curr_step}: saving step {curr_step}")
        self.save_now(curr_step)
        rank_progress.enter(Phase.UPLOAD)
        committed = self.wait_for_commit(curr_step)
        logger.info(f"slurm-titan: checkpoint step {curr_step} "
                    f"{'committed' if committed else 'NOT committed: the job resumes from an older one'}; "
                    "exiting for requeue")
        progress.note_stop(curr_step, reason, committed)
        preemption.exit_for_requeue()

    # -- saving -------------------------------------------------------------------------
    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        if self._force_save and self.enable and not self.load_only:
            return True
        return super()._should_save(curr_step, last_step)

    def save_now(self, curr_step: int) -> bool:
        """Save a full checkpoint of ``curr_step`` now, whatever the interval (every rank must call
        it, like any DCP save), and queue its upload. For the preemption path."""
        if self.sync is not None and self.sync.submitted(curr_step):
            return True  # saved (and queued) already: rewriting its files mid-upload would be wrong
        self._force_save = True
        try:
            return super().save(curr_step, last_step=False)  # torchtitan's save: no second stop check
        finally:
            self._force_save = False

    def _ram_step(self, step: int) -> None:
        """The RAM tier's part of every step: this rank's snapshot of ``step`` when due (every rank at the same
        step: it agrees the safe step), and, with an automatic interval, its settling after the probes."""
        assert self.ram is not None
        if self.ram.due(step):
            self.ram.save(sharded(self._flattened_model_states_sd()), step)  # within the step's budget: a copy only
            logger.info(f"slurm-titan: RAM snapshot of step {step}: training stopped {self.ram.last_blocked_s:.3f} s "
                        "(the copy to host memory); its write goes on in the background")
        if interval := self.ram.settle_interval():
            logger.info(f"slurm-titan: RAM tier: a snapshot every {interval} step(s) (checkpoint.memory.interval: "
                        f"auto: a snapshot cost this rank {self.ram.cost_s:.3f} s, the median over {PROBES} probes of "
                        f"the time the {AFTER_PROBE} steps after each took beyond the median step; the slowest rank's "
                        f"<= {COST_SHARE:.0%} of the time)")

    def _load(self, step: int = -1) -> bool:
        loaded = self._load_snapshot(self._ram_restore) if self._ram_restore is not None else super()._load(step)
        trained = getattr(self.states.get("train_state"), "step", 0)  # the trainer: its step after the load
        rank_progress.enter(Phase.STEP, trained + 1)  # the attempt's first step begins (its own budget)
        return loaded

    def _load_snapshot(self, step_folder: Path) -> bool:
        """Load this rank's RAM snapshot from ``step_folder`` (the node's restore brought it there, complete)."""
        assert self.ram is not None
        begin = time.monotonic()
        states = sharded(self._states_to_load(model_only=False))
        self.ram.load(states, step_folder / ram_layout.rank_name(self.ram.rank))
        if MODEL in self.states:  # torchtitan flattens the model's states: their load is the wrapper's
            self.states[MODEL].load_state_dict(states)
        logger.info(f"slurm-titan: loaded the RAM snapshot {step_folder} in {time.monotonic() - begin:.2f} s")
        return True

    def dcp_save(self, state_dict, checkpoint_id, async_mode, enable_garbage_collection=False, to_hf=False):  # noqa: ANN001, ANN201
        """torchtitan's save, plus this rank's read map of it: which byte ranges its load on the same
        world size reads (DCP's load planner on the state dict just saved and the metadata the save
        returns: :func:`.dcp_plan.load_reads`). Sent with the upload, it lets a restore fetch each
        node's share only. Replicated tensors are saved as shards (:func:`.replicated.sharded`)."""
        self._reads = None
        if not to_hf:
            state_dict = sharded(state_dict)
        ret = super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        if not to_hf and self.sync is not None:
            resolved = {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state_dict.items()}

            rank = _rank_world()[0]

            def reads(metadata: object) -> tuple[list | None, dict | None]:
                if not isinstance(metadata, Metadata):
                    return None, None
                try:
                    return (load_reads(resolved, metadata),
                            small_items(metadata, rank, TransferConfig.from_env().block_size))
                except Exception as e:  # noqa: BLE001 - without a read map every node fetches it all
                    log.warning("no read map for %s (every node will fetch all of it): %s", checkpoint_id, e)
                    return None, None

            self._reads = reads
            if isinstance(ret, Metadata):
                computed = reads(ret)
                self._reads = lambda _md: computed
        return ret

    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized) -> None:  # noqa: ANN001
        """torchtitan's load, after checking that a folder holding this node's share of the checkpoint
        holds every range this rank's load reads (:func:`.dcp_plan.check_share`); replicated tensors are
        read as the shards they are saved as (:func:`.replicated.sharded`)."""
        if not from_hf:
            state_dict = sharded(state_dict)
            check_share(checkpoint_id, state_dict)
        super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        saving = self._should_save(curr_step, last_step)
        if saving:
            rank_progress.enter(Phase.SAVE, curr_step)
        try:
            return self._save_and_submit(curr_step, last_step)
        finally:
            if saving:  # the next step's time starts after the save
                rank_progress.enter(Phase.STEP, curr_step + 1)

    def _save_and_submit(self, curr_step: int, last_step: bool) -> bool:
        saved = super()._save(curr_step, last_step)
        if not saved or self.sync is None:
            return saved
        if last_step and self.last_save_model_only:
            log.warning("step %d: the final model-only checkpoint is not uploaded (training cannot resume "
                        "from it); pass --checkpoint.no-last-save-model-only to upload a full one", curr_step)
            return saved
        reads, self._reads = self._reads, None
        fut = self.save_future if (self.async_mode != AsyncMode.DISABLED and not last_step) else None
        if isinstance(fut, Future) or (fut is not None and hasattr(fut, "add_done_callback")):
            sync = self.sync

            def after_write(f: Future, step: int = curr_step) -> None:
                if f.cancelled() or f.exception() is not None:
                    log.error("step %d: the checkpoint save failed, not uploading it: %s", step,
                              None if f.cancelled() else f.exception())
                    return
                sync.submit(step, *(reads(f.result()) if reads else (None, None)))

            fut.add_done_callback(after_write)
        else:
            self.sync.submit(curr_step, *(reads(None) if reads else (None, None)))
        return saved

    def _purge_stale_checkpoints(self) -> None:
        # With an upload running, local retention is the uploader's job: it deletes a local
        # step only after this rank's files of it are uploaded (torchtitan's purge would not wait).
        if self.sync is None:
            super()._purge_stale_checkpoints()

    # -- waiting / closing ----------------------------------------------------------------
    def wait_for_commit(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Block until this rank's upload (rank 0: and the commit) of ``step`` is done
        (default: every step saved so far). True on success; True if nothing is uploaded."""
        if self.sync is None:
            return True
        if self.save_future is not None:
            try:
                self.save_future.result(timeout)
            except Exception as e:  # noqa: BLE001
                log.error("the last checkpoint save failed: %s", e)
                return False
        return self.sync.wait(step, timeout)

    def _close(self) -> None:
        rank_progress.enter(Phase.UPLOAD)
        try:
            if self.sync is not None and not self._sync_closed:
                self._sync_closed = True
                if self.save_future is not None:
                    try:
                        self.save_future.result()
                    except Exception as e:  # noqa: BLE001
                        log.error("the last checkpoint save failed: %s", e)
                if not self.sync.close(_close_timeout()):
                    log.error("some checkpoint uploads did not finish: %s",
                              {s: self.sync.status(s) for s in sorted(self.sync.in_flight())} or "see above")
        finally:
            super()._close()
            rank_progress.enter(Phase.DONE)


@override(
    target=CheckpointManager.Config,
    exact=True,
    description="slurm-titan: upload each checkpoint in the background and commit it atomically",
)
def synced_checkpoints(cfg: CheckpointManager.Config) -> SyncedCheckpointManager.Config:
    return derive(cfg, SyncedCheckpointManager.Config)
