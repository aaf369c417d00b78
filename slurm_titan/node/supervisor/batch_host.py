"""A job whose batch host was lost: requeued from a surviving node (runs in the node supervisor).

Jobs run with `sbatch --no-kill`, so that a lost node leaves the allocation and the batch shell restarts
the run on the others (`finish`). But when the lost node is the batch host itself, Slurm 22.05 removes
it, kills the batch step and the job step, and keeps the job RUNNING on the other nodes with nothing
left to decide ("Removing failed node n1 from JobId", the job then idles until its time limit). The
supervisors of the other nodes are the last of the job to run, and they see it two ways:

- their ranks failed (a lost peer breaks the collectives within seconds, before Slurm notices): the
  batch shell's watcher touches a heartbeat file every second while the step runs (`node.batch.step_watch.beat`); a
  supervisor whose ranks failed waits for one touch newer than the failure (`BEAT_STALE_S` at most).
  None came: it probes the batch host with a one-task step, and when that does not answer, it
  requeues the job itself;
- Slurm ended their step (SIGTERM): each asks whether the batch host is still in the job's node list,
  and if not requeues the job.

The first supervisor that requeues wins (the others' requeue is refused); Slurm gives the requeued job
healthy nodes, since the lost one is still allocated (completing) until it is marked down.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from slurm_titan import slurm
from slurm_titan.errors import ClusterError
from slurm_titan.hostlist import expand_hostlist
from slurm_titan.node.srun_probe import probe_failures
from slurm_titan.records.run_folder import batch_shell_beat

BEAT_STALE_S = 10.0  # the watcher touches every second; ten missed beats on a loaded node mean gone
POLL_S = 0.5


def _job_fields(job_id: str) -> dict[str, str]:
    try:
        return slurm.parse_key_values(slurm.run(["scontrol", "show", "job", "-o", job_id], check=False).stdout)
    except ClusterError:
        return {}


def lost_batch_host(job_id: str) -> str | None:
    """The job's batch host when Slurm has removed it from the job's nodes, else None."""
    fields = _job_fields(job_id)
    batch_host, nodes = fields.get("BatchHost"), fields.get("NodeList", "")
    if not batch_host or fields.get("JobState") != "RUNNING":
        return None
    try:
        return None if batch_host in expand_hostlist(nodes) else batch_host
    except ValueError:
        return None


def _requeue(job_id: str) -> bool:
    try:
        return slurm.run(["scontrol", "requeue", job_id], check=False).returncode == 0
    except ClusterError:
        return False


def requeue_orphaned(job_id: str) -> str | None:
    """Requeue the job if Slurm removed its batch host; returns that host when this call requeued it."""
    if (host := lost_batch_host(job_id)) is None:
        return None
    return host if _requeue(job_id) else None


def requeue_if_batch_shell_gone(job_dir: Path, attempt: int, job_id: str, failed_at: float, this_host: str,
                                stale_s: float = BEAT_STALE_S) -> str | None:
    """After this node's ranks failed at `failed_at`: wait for the batch shell's heartbeat; if none comes
    and the batch host does not answer a probe, requeue the job. Returns the lost batch host when this call
    requeued the job, else None (the batch shell lives and decides, or this is the batch host)."""
    fields = _job_fields(job_id)
    host = fields.get("BatchHost")
    if not host or host == this_host or fields.get("JobState") != "RUNNING":
        return None
    path = batch_shell_beat(job_dir, attempt)
    deadline = failed_at + stale_s
    while True:
        try:
            if os.stat(path).st_mtime > failed_at:
                return None
        except FileNotFoundError:
            pass
        if time.time() >= deadline:
            break
        time.sleep(POLL_S)
    if not probe_failures([host]):
        return None
    return host if _requeue(job_id) else None
