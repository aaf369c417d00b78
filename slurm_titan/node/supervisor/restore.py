"""Bring the newest complete checkpoint to a node's local disk while its ranks start, say what resumes.

With node-local checkpoint folders a requeued job may land on nodes that never saw the run, or
find local steps whose upload was cut short. The remote location's newest complete (committed)
checkpoint is the truth: it is restored (checksums verified) and newer uncommitted local steps
are moved aside before torchtitan looks. When the world size differs from the save, DCP
reshards model and optimizer, and the resharding data loader (overrides.resharding_loader) its
position; with `checkpoint.on_world_size_change: restart_data` the data restarts, and the log says so.

The supervisor starts the ranks first and restores while they import torch and build the model:
each rank's checkpoint hook waits at rank.restore_gate (a pipe from the supervisor) before
torchtitan looks at the folder, and takes the restore's verdict (records.restore_verdict) from it.
On another world size than the save's the node's ranks first answer, at that gate, which byte ranges
their load of the candidate reads (DCP's planner on their state dicts and its `.metadata`), and the
node fetches only those.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_titan.errors import StorageError
from slurm_titan.node.spec import CheckpointPlan
from slurm_titan.node.supervisor.ram import NodeMemory
from slurm_titan.ram.exchange import MemoryUnavailable
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.restore_verdict import RestoreVerdict

if TYPE_CHECKING:
    from slurm_titan.ckpt import NodePlanner


def import_store_library(remote: str) -> None:
    """Import what a restore from `remote` needs: slurm_titan.ckpt and the store's fsspec backend (s3fs and
    botocore for S3, ~1 CPU-second). Run in a thread of its own while the node waits for its word and runs its
    preflight, so that a restart's restore does not import on its critical path; what fails here the restore says."""
    with contextlib.suppress(Exception):  # the restore itself imports again and says what is wrong
        import fsspec

        import slurm_titan.ckpt  # noqa: F401

        if "://" in remote:
            fsspec.get_filesystem_class(remote.split("://", 1)[0].lower())


def restore(plan: CheckpointPlan, local: str, job_id: str, world_size: int, say, *,  # noqa: ANN001
            ranks: list[int] | None = None, node: int = 0, nodes: int = 1,
            verdicts: HeldFolder | None = None,
            planner: NodePlanner | None = None, memory: NodeMemory | None = None) -> RestoreVerdict:
    """Restore what this node needs; returns what the ranks' checkpoint hook must know of it.
    Raises StorageError (one line) when the remote location cannot be reached.

    ``ranks``: this node's global ranks: on the world size that saved the checkpoint only their
    share is fetched (whole checkpoint otherwise, or without them). ``planner``: on another world
    size, what these ranks' loads read of a candidate (the supervisor's ``RankGroup.plan``): only
    that is fetched (the whole checkpoint without it). ``verdicts``: a folder of the job attempt on
    the shared filesystem (held open) through which the ``nodes`` nodes agree on each candidate before any rank
    loads it (:class:`slurm_titan.ckpt.NodeAgreement`). A store that throttles is waited out (each
    operation up to SLURM_TITAN_STORE_RETRY_S seconds), the waits said through ``say`` at most every 30 s;
    the StorageError when it still throttles then names the object and the store's answer. ``memory``: the RAM
    tier, whose newest snapshot that every rank can get is taken when no store checkpoint is newer
    (:meth:`NodeMemory.recover`); the store is then listed, never read."""
    remote = plan.remote_for(job_id)
    if not remote:
        return RestoreVerdict()
    from slurm_titan.ckpt import NodeAgreement, Wanted, prepare_resume

    Path(local).mkdir(parents=True, exist_ok=True)
    agree = NodeAgreement(verdicts, node, nodes) if verdicts is not None and nodes > 1 else None
    if memory is not None and (verdict := _from_memory(memory, plan, remote, local, agree, say)):
        return verdict
    with open(Path(local) / ".slurm-titan-resume.lock", "w") as lock:  # one restore per folder at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        restored = prepare_resume(remote, local, wanted=Wanted(ranks, world_size, planner),
                                  endpoint_url=plan.endpoint_url, agree=agree,
                                  notice=lambda line: say(f"checkpoint restore: {line}"))
    if restored is None:
        say(f"no complete checkpoint in {remote}: training starts at step 1")
        return RestoreVerdict()
    step = restored.step
    if restored.share is not None:
        say(f"checkpoint step {step}: this node's share (ranks {restored.share.ranks[0]}-{restored.share.ranks[-1]}) "
            f"fetched: {restored.fetched} of {restored.bytes} bytes")
    if restored.world_size != world_size:
        data = ("the data position is resharded by the data loader" if plan.reshards_data else
                "the data loader position is NOT restored (checkpoint.on_world_size_change: restart_data): every "
                "rank restarts its data at the beginning of the dataset")
        say(f"resuming complete checkpoint step {step} saved by {restored.world_size} ranks on {world_size} ranks: "
            f"model and optimizer are resharded by DCP; {data}")
        return RestoreVerdict(world_size_changed=True)
    say(f"resuming complete checkpoint step {step} from {remote}: model, optimizer, data position and RNG")
    return RestoreVerdict()


def _from_memory(memory: NodeMemory, plan: CheckpointPlan, remote: str, local: str, agree, say,  # noqa: ANN001
                 ) -> RestoreVerdict | None:
    """The RAM tier's verdict, None when the store is the one to restore from (the line saying why is out). Newer
    uncommitted local steps are moved aside as a store restore would."""
    from slurm_titan.ckpt import hide_uncommitted, list_checkpoints, newest_complete, open_store

    try:  # a node that cannot list the store still takes part in the round (as a rejection): none waits for it
        newest = newest_complete(list_checkpoints(open_store(remote, endpoint_url=plan.endpoint_url, check=True,
                                                             create=True)))
        stored, unlisted = (newest.step if newest is not None else None), ""
    except StorageError as error:
        stored, unlisted = None, f"the store cannot be listed ({error})"
    try:
        verdict = memory.recover(stored, agree, refuse=unlisted)
    except MemoryUnavailable as error:
        say(f"RAM tier: {error}: restoring from the store")
        return None
    if verdict is not None:
        hide_uncommitted(local, newer_than=stored)
    return verdict
