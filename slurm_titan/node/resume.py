"""Before the ranks start on a node: bring the newest complete checkpoint to local disk, say what resumes.

With node-local checkpoint folders a requeued job may land on nodes that never saw the run, or
find local steps whose upload was cut short. The remote location's newest complete (committed)
checkpoint is the truth: it is restored (checksums verified) and newer uncommitted local steps
are moved aside before torchtitan looks. When the world size differs from the save, DCP
reshards model and optimizer; the data loader's position cannot be resharded, and the log says so.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from slurm_titan.plan import CheckpointPlan

SKIP_DATALOADER_ENV = "SLURM_TITAN_SKIP_DATALOADER_STATE"


def prepare(plan: CheckpointPlan, local: str, job_id: str, world_size: int, say) -> dict[str, str]:  # noqa: ANN001
    """Restore what this node needs; returns the environment the ranks' checkpoint hook reads.

    Raises StorageError (one line) when the remote location cannot be reached.
    """
    env = plan.rank_env(job_id)
    if not plan.remote:
        return env
    from slurm_titan.ckpt.catalog import list_checkpoints
    from slurm_titan.ckpt.resume import prepare_resume
    from slurm_titan.ckpt.store import open_store

    remote = env["SLURM_TITAN_CKPT_REMOTE"]
    Path(local).mkdir(parents=True, exist_ok=True)
    with open(Path(local) / ".slurm-titan-resume.lock", "w") as lock:  # one restore per folder at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        step = prepare_resume(remote, local, endpoint_url=plan.endpoint_url)
    if step is None:
        say(f"no complete checkpoint in {remote}: training starts at step 1")
        return env
    saved = next((c for c in list_checkpoints(open_store(remote, endpoint_url=plan.endpoint_url)) if c.step == step), None)
    saved_world = saved.world_size if saved else None
    if saved_world is not None and saved_world != world_size:
        say(f"resuming complete checkpoint step {step} saved by {saved_world} ranks on {world_size} ranks: "
            "model and optimizer are resharded by DCP; the data loader position is per data-parallel rank and is "
            "NOT restored: every rank restarts its data at the beginning of the dataset")
        env[SKIP_DATALOADER_ENV] = "1"
    else:
        say(f"resuming complete checkpoint step {step} from {remote}: model, optimizer, data position and RNG")
    return env
