"""Submit a planned job through submitit and remember it on the login node."""

from __future__ import annotations

from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError

from slurm_titan import registry, slurm
from slurm_titan.errors import ClusterError
from slurm_titan.node.supervisor import NodeSupervisor
from slurm_titan.plan import JobPlan


def preflight(plan: JobPlan) -> None:
    """What the cluster must offer before anything is submitted; ClusterError otherwise."""
    for command in ("sbatch", "srun", "scontrol"):
        slurm.run([command, "--version"])
    slurm.check_resources(plan.config.slurm.partition, plan.config.slurm.nodes)
    checkpoint = plan.node.checkpoint
    if checkpoint and checkpoint.remote:
        from slurm_titan.ckpt.store import open_store

        root = checkpoint.remote.split("{job_id}")[0].rstrip("/")
        open_store(root, endpoint_url=checkpoint.endpoint_url, check=True, create=True)


def prepare_assets(plan: JobPlan) -> None:
    if plan.config.torchtitan.debug_assets:
        from slurm_titan.debug_assets import ensure_assets

        ensure_assets(Path(plan.config.torchtitan.debug_assets))


def submit(plan: JobPlan) -> registry.JobRecord:
    """Check the cluster, submit, record the job; returns its record."""
    preflight(plan)
    prepare_assets(plan)
    executor = submitit.SlurmExecutor(folder=plan.folder, python=plan.launcher)
    executor.update_parameters(**plan.parameters)
    try:
        job = executor.submit(NodeSupervisor(plan.node))
    except FailedJobError as error:
        lines = [line for line in str(error).splitlines() if "error" in line.lower()] or str(error).splitlines()
        raise ClusterError(f"sbatch refused the job: {lines[0].strip()}") from None
    job_dir, _ = plan.node.resolve(job.job_id)
    record = registry.new_record(job.job_id, plan.config.name, job_dir, plan.config.source, plan.config.slurm.nodes)
    registry.save(record)
    return record
