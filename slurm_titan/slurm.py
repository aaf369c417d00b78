"""Thin, typed wrappers around Slurm's commands (sinfo/scontrol/squeue/sacct/scancel), and Slurm's time format.

Each failure becomes a one-line `ClusterError`: a missing command names itself, a refused
request carries Slurm's own first line.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass

from slurm_titan.errors import ClusterError

TIMEOUT_S = 30
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
FINISHED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                   "PREEMPTED"}


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command; ClusterError if it is missing or (with check) fails."""
    if shutil.which(argv[0]) is None:
        raise ClusterError(f"{argv[0]} not found on PATH: run on a Slurm login node "
                           "(Debian: apt-get install slurm-client)")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(argv)} did not answer within {TIMEOUT_S} s: is slurmctld up?") from None
    if check and result.returncode != 0:
        first = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}").splitlines()[0]
        raise ClusterError(f"{argv[0]} failed: {first}")
    return result


def parse_key_values(line: str) -> dict[str, str]:
    """`scontrol show -o` output: space-separated Key=Value pairs (values may not contain spaces, except the last)."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def time_limit_minutes(text: str) -> int:
    """Slurm's time formats (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) in whole minutes, rounded up."""
    match = _TIME.match(text.strip())
    if not match:
        raise ValueError(f"bad time {text!r}: use minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    days, *clock = match.groups()
    numbers = [int(part) for part in clock if part is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # M, M:S, H:M:S
        hours, minutes, seconds = ([0, 0] + numbers)[-3:] if len(numbers) == 3 else (0, *(numbers + [0])[:2])
    if (len(numbers) > 1 and minutes >= 60 and (days is not None or len(numbers) == 3)) or seconds >= 60:
        raise ValueError(f"bad time {text!r}: minutes and seconds must be below 60")
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ValueError(f"bad time {text!r}: must be positive")
    return math.ceil(total / 60)


@dataclass(frozen=True)
class Partition:
    name: str
    total_nodes: int
    state: str
    default: bool


def partitions() -> dict[str, Partition]:
    out = run(["scontrol", "show", "partition", "-o"]).stdout
    parts = {}
    for line in out.splitlines():
        fields = parse_key_values(line)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = Partition(
                fields["PartitionName"], int(fields.get("TotalNodes", "0")), fields.get("State", "UP"),
                fields.get("Default", "NO") == "YES")
    return parts


def check_resources(partition: str | None, nodes: int) -> Partition:
    """The partition the job would run in; ClusterError if unknown, down, or smaller than `nodes`."""
    known = partitions()
    if partition is None:
        default = next((p for p in known.values() if p.default), None)
        if default is None:
            raise ClusterError("no partition given and the cluster has no default partition")
        chosen = default
    elif partition not in known:
        raise ClusterError(f"unknown partition {partition!r}; the cluster has: {', '.join(sorted(known)) or 'none'}")
    else:
        chosen = known[partition]
    if nodes > chosen.total_nodes:
        raise ClusterError(f"--nodes {nodes} exceeds partition {chosen.name!r}, which has {chosen.total_nodes} node(s)")
    if chosen.state != "UP":
        raise ClusterError(f"partition {chosen.name!r} is {chosen.state}")
    return chosen


@dataclass(frozen=True)
class JobState:
    """What Slurm says of a job now; `source` says which command answered."""

    job_id: str
    state: str
    reason: str
    nodes: str
    restarts: int
    exit_code: str
    source: str


def _from_scontrol(job_ids: list[str]) -> dict[str, JobState]:
    """One `scontrol show job -o`: of the job asked, or of every job the controller remembers when asked of several."""
    result = run(["scontrol", "show", "job", "-o", *job_ids[:1 if len(job_ids) == 1 else 0]], check=False)
    states = {}
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        fields = parse_key_values(line)
        if (job_id := fields.get("JobId")) in job_ids:
            states[job_id] = JobState(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                                      fields.get("NodeList", ""), int(fields.get("Restarts", "0")),
                                      fields.get("ExitCode", ""), "scontrol")
    return states


def _from_sacct(job_ids: list[str]) -> dict[str, JobState]:
    """One sacct over the jobs asked (the last record of each: a requeued job has one per run)."""
    if not job_ids or shutil.which("sacct") is None:
        return {}
    result = run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobIDRaw,State,Reason,NodeList,ExitCode"],
                 check=False)
    states = {}
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        job_id, state, reason, nodelist, exit_code = (line.split("|") + ["", "", "", "", ""])[:5]
        if job_id in job_ids and state.strip():
            states[job_id] = JobState(job_id, state.split()[0], reason, nodelist, 0, exit_code, "sacct")
    return states


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Slurm's view of jobs in two commands at most, however many (a command per job slows a busy controller):
    scontrol while the controller remembers a job, else accounting; a job neither knows is left out."""
    known = _from_scontrol(job_ids) if job_ids else {}
    return known | _from_sacct([job_id for job_id in job_ids if job_id not in known])


def job_state(job_id: str) -> JobState | None:
    """Slurm's view of a job: scontrol while the controller remembers it, else accounting; None if neither knows."""
    return job_states([job_id]).get(job_id)


def state_name(job_id: str) -> str | None:
    """The name of a job's state (RUNNING, CANCELLED, ...), None if neither scontrol nor accounting knows it."""
    found = job_state(job_id)
    return found.state if found else None


def time_left_seconds(job_id: str) -> int | None:
    """Seconds until the job's own time limit (StartTime + TimeLimit); None if unknown or unlimited.

    Not EndTime: a preempted job's EndTime is pulled in to now + GraceTime, which would make a
    preemption look like the time limit.
    """
    import datetime

    result = run(["scontrol", "show", "job", "-o", job_id], check=False)
    fields = parse_key_values(result.stdout) if result.returncode == 0 else {}
    try:
        started = datetime.datetime.fromisoformat(fields.get("StartTime", ""))
        limit = datetime.timedelta(minutes=time_limit_minutes(fields.get("TimeLimit", "")))
    except ValueError:
        return None
    return int((started + limit - datetime.datetime.now()).total_seconds())


def cancel(job_id: str) -> JobState:
    """Cancel a job that Slurm knows and that has not ended; returns its state before. scancel itself exits 0
    for an unknown id and for an ended job, so each is a ClusterError here, and nothing is sent."""
    state = job_state(job_id)
    if state is None:
        raise ClusterError(f"no job {job_id}: neither scontrol nor sacct knows it")
    if state.state in FINISHED_STATES:
        raise ClusterError(f"job {job_id} has already ended ({state.state}): nothing to cancel")
    run(["scancel", job_id])
    return state
