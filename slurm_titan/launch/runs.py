"""`slurm-titan runs`: the recent runs submitted from here, one line each (from the registry).

The last checkpoint is the newest `checkpoint step N committed` line near the end of rank 0's log
(rank 0's uploader commits every checkpoint, slurm_titan.ckpt.commit), else what the history shows
(a checkpoint committed on a stop signal, or the step a later attempt resumed from); no storage
is contacted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from slurm_titan import table
from slurm_titan.launch import goodput, status
from slurm_titan.records import history, jobs, run_folder

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
    return {"job_id": record.job_id, "name": record.name, "state": info["state"],
            "step": goodput.current_step(record.folder, attempts),
            "last_checkpoint": last_checkpoint(record.folder, attempts),
            "goodput": (info["goodput"] or {}).get("goodput"), "submitted": record.submitted}


def show(limit: int = 20, as_json: bool = False) -> int:
    records = jobs.recent(limit)
    rows = [row(record, info) for record, info in zip(records, status.describe_all([r.job_id for r in records]),
                                                      strict=True)]
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no jobs submitted from here yet")
        return 0
    print(table.render(("JOB", "NAME", "STATE", "STEP", "CHECKPOINT", "GOODPUT"), [
        (r["job_id"], r["name"], r["state"], _dash(r["step"]), _dash(r["last_checkpoint"]),
         "-" if r["goodput"] is None else f"{r['goodput'] * 100:.1f}%") for r in rows]))
    return 0


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)
