"""One view of a run across its jobs (records.run_registry): every attempt of every job in order, on the run's one
step axis and one wall clock, and the goodput of the whole run (launch.goodput): from its first job's submit to now
or its last attempt's end, the gaps between jobs (queue, idle) counted lost as the queue of the next job's first
attempt, steps a job retrained after resuming counted as retrained. Reads only the job folders."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from slurm_titan.launch import goodput
from slurm_titan.records import history, jobs
from slurm_titan.records.run_registry import RunRecord


@dataclass(frozen=True)
class RunView:
    """A run's jobs recorded here (in submit order), its attempts as (job id, attempt) in order, the same attempts
    numbered across the run (`numbered`), its first job's submit time, and its goodput (whose attempts are in the
    same order)."""

    name: str
    jobs: list[jobs.JobRecord]
    attempts: list[tuple[str, history.Attempt]]
    numbered: list[history.Attempt]
    submitted: float
    goodput: goodput.Goodput


def view(record: RunRecord, now: float) -> RunView:
    """The run of `record` as its job folders tell it."""
    known = [job for job_id in record.jobs if (job := jobs.find(job_id)) is not None]
    pairs: list[tuple[str, history.Attempt]] = []
    merged: list[history.Attempt] = []
    files: goodput.TrainedFiles = {}
    for job in known:
        attempts = history.read_attempts(job.folder)
        own = goodput.trained_files(job.folder, attempts)
        for attempt in attempts:
            if attempt.attempt in own:
                files[len(merged)] = own[attempt.attempt]
            merged.append(dataclasses.replace(attempt, attempt=len(merged)))  # numbered across the run
            pairs.append((job.job_id, attempt))
    submitted = known[0].submitted if known else record.created
    return RunView(record.name, known, pairs, merged, submitted, goodput.compute(merged, submitted, now, files))
