"""Bring the newest complete checkpoint to a node's local disk while its ranks start, say what resumes.

With node-local checkpoint folders a requeued job may land on nodes that never saw the run, or
find local steps whose upload was cut short. The remote location's newest complete (committed)
checkpoint is the truth: it is restored (checksums verified) and newer uncommitted local steps
are moved aside before torchtitan looks. When the world size differs from the save, DCP
reshards model and optimizer, and the resharding data loader (overrides.resharding_loader) its
position; with `checkpoint.on_world_size_change: restart_data` the data restarts, and the log says so.

The supervisor starts the ranks first and restores while they import torch and build the model:
each rank's checkpoint hook waits at :func:`wait_for_restore` (a pipe from the supervisor) before
torchtitan looks at the folder, and takes the restore's verdict from it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from slurm_titan.launch.plan import CheckpointPlan

SKIP_DATALOADER_ENV = "SLURM_TITAN_SKIP_DATALOADER_STATE"
RESTORE_FD_ENV = "SLURM_TITAN_RESTORE_FD"


def restore(plan: CheckpointPlan, local: str, job_id: str, world_size: int, say, *,  # noqa: ANN001
            ranks: list[int] | None = None, node: int = 0, nodes: int = 1,
            verdicts: str | os.PathLike | None = None) -> dict[str, str]:
    """Restore what this node needs; returns what the ranks' checkpoint hook must add to its
    environment. Raises StorageError (one line) when the remote location cannot be reached.

    ``ranks``: this node's global ranks: on the world size that saved the checkpoint only their
    share is fetched (whole checkpoint otherwise, or without them). ``verdicts``: a folder of the
    job attempt on the shared filesystem through which the ``nodes`` nodes agree on each
    candidate before any rank loads it (:class:`slurm_titan.ckpt.agree.NodeAgreement`)."""
    if not plan.remote:
        return {}
    from slurm_titan.ckpt.agree import NodeAgreement
    from slurm_titan.ckpt import prepare_resume

    remote = plan.rank_env(job_id)["SLURM_TITAN_CKPT_REMOTE"]
    Path(local).mkdir(parents=True, exist_ok=True)
    agree = NodeAgreement(verdicts, node, nodes) if verdicts is not None and nodes > 1 else None
    with open(Path(local) / ".slurm-titan-resume.lock", "w") as lock:  # one restore per folder at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        restored = prepare_resume(remote, local, endpoint_url=plan.endpoint_url, ranks=ranks, world_size=world_size,
                                  agree=agree)
    if restored is None:
        say(f"no complete checkpoint in {remote}: training starts at step 1")
        return {}
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
        return {SKIP_DATALOADER_ENV: "1"}
    say(f"resuming complete checkpoint step {step} from {remote}: model, optimizer, data position and RNG")
    return {}


def wait_for_restore() -> None:
    """In a rank: block until the node's restore is done and apply what it says to os.environ.

    Does nothing when the rank was started without a restore to wait for. Raises RuntimeError
    when the restore failed or the supervisor went away (the node log says why)."""
    fd = os.environ.pop(RESTORE_FD_ENV, "")
    if not fd:
        return
    with os.fdopen(int(fd), "rb") as pipe:
        verdict = pipe.read()
    if not verdict:
        raise RuntimeError("slurm-titan: this node's checkpoint restore failed or was cut short; see the node log")
    os.environ.update(json.loads(verdict))
