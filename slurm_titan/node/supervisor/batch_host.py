"""A job whose batch host was lost: requeued from a surviving node (runs in the node supervisor).

Jobs run with `sbatch --no-kill`, so that a lost node leaves the allocation and the batch shell restarts
the run on the others (`finish`). But when the lost node is the batch host itself, Slurm 22.05 removes
it, kills the batch step and the job step, and keeps the job RUNNING on the other nodes with nothing
left to decide ("Removing failed node n1 from JobId", the job then idles until its time limit). The
supervisors of the other nodes are the last of the job to run, and they see it two ways:

- their ranks failed (a lost peer breaks the collectives within seconds, before Slurm notices): the
  batch shell's watcher touches a heartbeat file every second while the step runs, and as it sights a node's report
  (`node.batch.step_watch`); a supervisor notes the heartbeat's time when it sees its ranks fail (:func:`mark_beat`)
  and waits for the time to change (`BEAT_STALE_S` at most, on its own monotonic clock), and asks slurmctld nothing
  while the shell beats.
  Only the heartbeat's times are compared, with each other: a node's clock skewed against the batch host's or the
  file server's changes nothing. None came: one supervisor claims the check (it makes the attempt's
  `batch-host-probe` exclusively), asks Slurm for the batch host, probes it with a one-task step and, when it does
  not answer, requeues the job; it writes what it found in its claim, which the others wait for (a claim without
  an outcome after `CLAIM_STALE_S` was left by a claimant that died: the next one takes over). One query, one
  probe and one requeue per loss, however many nodes survive;
- Slurm ended their step (SIGTERM): each asks whether the batch host is still in the job's node list,
  and if not requeues the job.

The first supervisor that requeues wins (the others' requeue is refused); Slurm gives the requeued job
healthy nodes, since the lost one is still allocated (completing) until it is marked down. A Slurm query that
gets no answer is said in the node log and asked again (`QUERY_TRIES`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from slurm_titan import slurm
from slurm_titan.errors import ClusterError
from slurm_titan.hostlist import expand_hostlist
from slurm_titan.node.node_log import say
from slurm_titan.node.srun_probe import PROBE_TIMEOUT_S, STEP_CREATION_S, probe_failures
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.polls import poll_waits

BEAT_STALE_S = 10.0  # the watcher touches every second; ten missed beats on a loaded node mean gone
POLL_S = 0.5
BEAT_POLL_S = 0.1
"""The first wait for the heartbeat after a failure (growing to POLL_S, spread by the job's size: records.polls): the
batch shell touches it as it sights the node's report, and the srun step, on every fault's path to the next step,
ends only when the node's supervisor does."""
QUERY_TRIES = 3
CLAIM_STALE_S = STEP_CREATION_S + PROBE_TIMEOUT_S + (QUERY_TRIES + 1) * slurm.TIMEOUT_S
"""The longest a claimant's check may take (its queries, its probe, its requeue): a claim without an outcome
after that, as a waiting supervisor's own clock counts, was left by a claimant that died."""


def _job_fields(job_id: str, tries: int = QUERY_TRIES) -> dict[str, str]:
    """The job's fields from `scontrol show job`; a query that fails (a busy slurmctld does not answer within
    slurm.TIMEOUT_S) is said and asked again, `tries` times at most ({} after the last)."""
    for tried in range(1, tries + 1):
        try:
            return slurm.parse_key_values(slurm.run(["scontrol", "show", "job", "-o", job_id]).stdout)
        except ClusterError as error:
            say(f"{error}" + ("; asking again" if tried < tries else f"; giving up after {tries} tries"))
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


@dataclass(frozen=True)
class BeatMark:
    """The batch shell's heartbeat as a supervisor saw it when its ranks failed: the heartbeat's modification time
    (None: not there yet) and when it looked, on the supervisor's monotonic clock."""

    mtime: float | None
    seen_at: float


def mark_beat(attempt_dir: HeldFolder) -> BeatMark:
    """The heartbeat's time now, in the attempt's folder: one lookup."""
    beat = attempt_dir.stat(run_folder.BATCH_SHELL_BEAT)
    return BeatMark(beat.st_mtime if beat else None, time.monotonic())


def requeue_if_batch_shell_gone(attempt_dir: HeldFolder, job_id: str, failed: BeatMark, this_host: str, nodes: int,
                                stale_s: float = BEAT_STALE_S) -> str | None:
    """After this node's ranks failed (the heartbeat then: `failed`): wait for the batch shell's next heartbeat;
    if none comes within `stale_s` of the failure, check the batch host (:func:`_check`), or wait for the
    supervisor that claimed that check. Returns the lost batch host when this call requeued the job, else None
    (the batch shell lives and decides, this is the batch host, or another supervisor checked). The heartbeat and
    the claims are names in `attempt_dir`, the attempt's folder held open: a poll is a lookup of one name."""
    if _beat_since(attempt_dir, failed, failed.seen_at + stale_s, nodes):
        return None
    claim = 0
    while (fd := attempt_dir.create_exclusive(run_folder.batch_host_probe_name(claim))) is None:
        if _outcome_written(attempt_dir, run_folder.batch_host_probe_name(claim)):
            return None
        claim += 1
    with os.fdopen(fd, "w") as outcome:
        host, found = _check(job_id, this_host)
        say(f"no heartbeat from the batch shell since the ranks failed: {found}")
        outcome.write(found)
    return host


def _beat_since(attempt_dir: HeldFolder, failed: BeatMark, deadline: float, nodes: int) -> bool:
    """Whether the batch shell touches its heartbeat after `failed` (its time differs from the one then), waited
    for until `deadline` (monotonic), looked up as often as a job of `nodes` nodes may."""
    waits = poll_waits(nodes, first=BEAT_POLL_S, cap=POLL_S)
    while True:
        if (beat := attempt_dir.stat(run_folder.BATCH_SHELL_BEAT)) and beat.st_mtime != failed.mtime:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(next(waits))


def _outcome_written(attempt_dir: HeldFolder, claim: str) -> bool:
    """Wait for the claimant's outcome in its `claim`: True once written, False when none came within
    CLAIM_STALE_S (the claimant died: the caller takes over)."""
    deadline = time.monotonic() + CLAIM_STALE_S
    while time.monotonic() < deadline:
        if (found := attempt_dir.stat(claim)) is None:
            return False
        if found.st_size:
            return True
        time.sleep(POLL_S)
    return False


def _check(job_id: str, this_host: str) -> tuple[str | None, str]:
    """The claimant's check of the batch host: the lost batch host it requeued the job for (else None), and what
    it found."""
    fields = _job_fields(job_id)
    host, state = fields.get("BatchHost"), fields.get("JobState")
    if not host or state != "RUNNING":
        return None, f"job {job_id} is {state or 'unknown to scontrol'}: nothing to requeue"
    if host == this_host:
        return None, f"this node is the batch host {host}: nothing to requeue"
    if not probe_failures([host]):
        return None, f"the batch host {host} answers: nothing to requeue"
    if not _requeue(job_id):
        return None, f"the batch host {host} does not answer; scontrol requeue {job_id} did not succeed " \
                     "(requeued already?)"
    return host, f"the batch host {host} does not answer: requeued job {job_id}"
