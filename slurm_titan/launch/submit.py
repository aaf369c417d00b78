"""Submit a planned job through submitit and remember it on the login node."""

from __future__ import annotations

import sys
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError

from slurm_titan import slurm
from slurm_titan.errors import ClusterError
from slurm_titan.launch import run_binding
from slurm_titan.launch.plan import JobPlan
from slurm_titan.launch.run_binding import RunBinding
from slurm_titan.node.supervisor.supervisor import NodeSupervisor
from slurm_titan.records import jobs, ledger


def preflight(plan: JobPlan) -> JobPlan:
    """What the cluster must offer before anything is submitted (ClusterError otherwise); returns the
    plan to submit: with fewer spare nodes, and one warning, when the partition has no room for all."""
    for command in ("sbatch", "srun", "scontrol"):
        slurm.run([command, "--version"])
    slurm_spec = plan.config.slurm
    partition = slurm.check_resources(slurm_spec.partition, slurm_spec.nodes)
    room = partition.total_nodes - slurm_spec.nodes
    if slurm_spec.spare_nodes > room:
        print(f"slurm-titan: WARNING: {plan.config.source}: slurm.spare_nodes={slurm_spec.spare_nodes} does not fit "
              f"partition {partition.name!r} ({partition.total_nodes} nodes for {slurm_spec.nodes} + spares); "
              f"submitting with {room} spare node(s)", file=sys.stderr)
        plan = plan.with_spares(room)
    if off := ledger.keep_off(ledger.avoid_now(), partition.total_nodes, plan.parameters["nodes"]):
        print(f"slurm-titan: keeping the job off {','.join(off)}: failed recently on this cluster "
              "(slurm-titan nodes)", file=sys.stderr)
        plan = plan.excluding(off)
    checkpoint = plan.node.checkpoint
    if checkpoint and (root := checkpoint.remote_root()) is not None:
        from slurm_titan.ckpt import open_store

        open_store(root, endpoint_url=checkpoint.endpoint_url, check=True, create=True)
    return plan


def prepare_assets(plan: JobPlan) -> None:
    if plan.config.torchtitan.debug_assets:
        from slurm_titan.launch.debug_assets import ensure_assets

        ensure_assets(Path(plan.config.torchtitan.debug_assets))


def submit(plan: JobPlan, binding: RunBinding | None = None) -> jobs.JobRecord:
    """Check the cluster, the run and its location (launch.run_binding), submit, record the job and its run;
    returns its record."""
    binding = binding or RunBinding()
    plan = preflight(plan)
    take_over = plan.batch.lease is not None and plan.batch.lease.take_over
    if line := run_binding.check(binding, plan.config, take_over=take_over):
        print(f"slurm-titan: {line}", file=sys.stderr)
    prepare_assets(plan)
    executor = submitit.SlurmExecutor(folder=plan.folder, python=plan.launcher)
    executor.update_parameters(**plan.parameters)
    try:
        job = executor.submit(NodeSupervisor(plan.node))
    except FailedJobError as error:
        lines = [line for line in str(error).splitlines() if "error" in line.lower()] or str(error).splitlines()
        raise ClusterError(f"sbatch refused the job: {lines[0].strip()}") from None
    job_dir, _ = plan.node.resolve(job.job_id)
    remote = plan.node.checkpoint.remote_for(job.job_id) if plan.node.checkpoint else None
    record = jobs.new_record(job.job_id, plan.config.name, job_dir, plan.config.source, plan.config.slurm.nodes,
                             binding.name, remote)
    jobs.save(record)
    run_binding.record(binding, job.job_id)
    return record
