"""A job whose batch host was lost: requeued from a surviving node (runs in the node supervisor).

Jobs run with `sbatch --no-kill`, so that a lost node leaves the allocation and the batch shell restarts
the run on the others (`finish`). But when the lost node is the batch host itself, Slurm 22.05 removes
it, kills the batch step and the job step, and keeps the job RUNNING on the other nodes with nothing
left to decide ("Removing failed node n1 from JobId", the job then idles until its time limit). The
supervisors of the other nodes are the last of the job to run: when Slurm ends their step, each asks
whether the job's batch host is still in its node list, and if not requeues the job (the first one
that asks wins; Slurm gives the requeued job healthy nodes).
"""

from __future__ import annotations

from slurm_titan import slurm
from slurm_titan.errors import ClusterError
from slurm_titan.hostlist import expand_hostlist


def lost_batch_host(job_id: str) -> str | None:
    """The job's batch host when Slurm has removed it from the job's nodes, else None."""
    try:
        shown = slurm.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout
    except ClusterError:
        return None
    fields = slurm.parse_key_values(shown)
    batch_host, nodes = fields.get("BatchHost"), fields.get("NodeList", "")
    if not batch_host or fields.get("JobState") != "RUNNING":
        return None
    try:
        return None if batch_host in expand_hostlist(nodes) else batch_host
    except ValueError:
        return None


def requeue_orphaned(job_id: str) -> str | None:
    """Requeue the job if its batch host is lost; returns that host when this call requeued it."""
    if (host := lost_batch_host(job_id)) is None:
        return None
    try:
        result = slurm.run(["scontrol", "requeue", job_id], check=False)
    except ClusterError:
        return None
    return host if result.returncode == 0 else None
