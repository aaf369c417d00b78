"""`slurm-titan runs`: the recent runs submitted from here, one line each (from the registry): a run of several jobs
(records.run_registry) as one line (its jobs, the newest job's state, the run's step and last checkpoint, its goodput
over all its jobs: launch.run_view), a job of no run as its own.

The last checkpoint is the newest `checkpoint step N committed` line near the end of rank 0's log
(rank 0's uploader commits every checkpoint, slurm_titan.ckpt.commit), else what the history shows
(a checkpoint committed on a stop signal, or the step a later attempt resumed from); no storage
is contacted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurm_titan import table
from slurm_titan.launch import goodput, run_view, status
from slurm_titan.records import history, jobs, run_folder, run_registry

_COMMITTED = re.compile(rb"checkpoint step (\d+) committed")
TAIL_BLOCK = 1 << 18
TAIL_LIMIT = 1 << 24
"""Bytes of rank 0's log read from its end at most, in blocks of TAIL_BLOCK."""


def _committed_in_log(path: Path) -> int | None:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    with handle:
        end = handle.seek(0, 2)
        start = end
        while start > 0 and end - start < TAIL_LIMIT:
            start = max(0, start - TAIL_BLOCK)
            handle.seek(start)
            found = _COMMITTED.findall(handle.read(end - start))
            if found:
                return int(found[-1])
    return None


def last_checkpoint(job_dir: Path, attempts: list[history.Attempt]) -> int | None:
    """The newest checkpoint step known to be committed (None: none known)."""
    known = [a.stopped_at_step for a in attempts if a.stopped_at_step and a.extra.get("committed")]
    known += [a.first_step - 1 for a in attempts[1:] if a.first_step and a.first_step > 1]
    logged = _committed_in_log(run_folder.rank_log(job_dir, 0))
    known += [logged] if logged is not None else []
    return max(known) if known else None


def row(record: jobs.JobRecord, info: dict[str, Any]) -> dict[str, Any]:
    """The `runs` line of one job, from its record and :func:`status.describe`'s view of it."""
    attempts = history.read_attempts(record.folder)
    return {"run": record.run, "jobs": [record.job_id], "job_id": record.job_id, "name": record.name,
            "state": info["state"], "step": goodput.current_step(record.folder, attempts),
            "last_checkpoint": last_checkpoint(record.folder, attempts),
            "goodput": (info["goodput"] or {}).get("goodput"), "submitted": record.submitted}


def run_row(record: run_registry.RunRecord, job_rows: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The `runs` line of a run, from its jobs' lines (in submit order): the newest job's state, the run's step, its
    last checkpoint (a job's own, or the one a later job resumed from), and its goodput over all its jobs
    (launch.run_view)."""
    whole = run_view.view(record, now)
    resumed = [first - 1 for _, attempt in whole.attempts[1:] if (first := attempt.first_step or 0) > 1]
    newest = job_rows[-1]
    return {"run": record.name, "jobs": [r["job_id"] for r in job_rows], "job_id": newest["job_id"],
            "name": newest["name"], "state": newest["state"], "step": _newest(r["step"] for r in job_rows),
            "last_checkpoint": _newest([*(r["last_checkpoint"] for r in job_rows), *resumed]),
            "goodput": None if whole.goodput.ratio is None else round(whole.goodput.ratio, 4),
            "submitted": newest["submitted"]}


def rows(limit: int, now: float) -> list[dict[str, Any]]:
    """The newest `limit` lines: a run's jobs as one line of the run, a job of no run as its own."""
    runs_ = {name: record for name in run_registry.names() if (record := run_registry.load(name)) is not None}
    records = jobs.recent(limit) + [job for run in runs_.values() for job_id in run.jobs
                                    if (job := jobs.find(job_id)) is not None]
    unique = list({record.job_id: record for record in records}.values())
    by_job = {r["job_id"]: r for r in (row(record, info) for record, info in
                                       zip(unique, status.describe_all([r.job_id for r in unique]), strict=True))}
    lines = [by_job[job_id] for job_id in by_job if by_job[job_id]["run"] not in runs_]
    lines += [run_row(run, [by_job[j] for j in run.jobs if j in by_job], now) for run in runs_.values()
              if any(j in by_job for j in run.jobs)]
    return sorted(lines, key=lambda line: line["submitted"], reverse=True)[:limit]


def show(limit: int = 20, as_json: bool = False) -> int:
    lines = rows(limit, time.time())
    if as_json:
        print(json.dumps(lines, indent=1))
        return 0
    if not lines:
        print("no jobs submitted from here yet")
        return 0
    print(table.render(("JOB", "NAME", "RUN", "STATE", "STEP", "CHECKPOINT", "GOODPUT"), [
        (",".join(r["jobs"]), r["name"], r["run"] or "-", r["state"], _dash(r["step"]), _dash(r["last_checkpoint"]),
         "-" if r["goodput"] is None else f"{r['goodput'] * 100:.1f}%") for r in lines]))
    return 0


def _newest(values: Iterable[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)
