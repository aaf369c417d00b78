"""Where the login node remembers runs: one JSON file per run, beside the job records (records.jobs).

`$SLURM_TITAN_HOME/runs/<name>.json` holds a run's checkpoint location, fixed by its first job, and the ids of its
jobs in the order they were submitted, so that `submit --run NAME` and `--resume NAME` find where the run's
checkpoints are whatever the config says now, and `runs` which jobs the run had.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from slurm_titan.errors import RunError
from slurm_titan.records.jobs import home
from slurm_titan.records.whole_file import replace_text

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")


def name_problem(name: str) -> str:
    """Why `name` cannot name a run ("" when it can): it is a folder name and a path component of the location,
    and never a job id (those are digits), so a letter first, then letters, digits, '.', '_' or '-'."""
    if _NAME.match(name):
        return ""
    return (f"{name!r} is not a run name: a letter, then up to 127 letters, digits, '.', '_' or '-' (it becomes a "
            "file name and a part of the checkpoint location)")


@dataclass(frozen=True)
class RunRecord:
    """A run: its name, its checkpoint location (and the store's endpoint, when the config gave one), its jobs."""

    name: str
    remote: str
    endpoint_url: str | None = None
    created: float = 0.0
    jobs: list[str] = field(default_factory=list)


def _path(name: str) -> Path:
    return home() / "runs" / f"{name}.json"


def load(name: str) -> RunRecord | None:
    """The run called `name`, None when there is none; RunError (naming the file) when its record is unreadable."""
    path = _path(name)
    try:
        return RunRecord(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        raise RunError(f"{path}: unreadable run record ({error})") from None


def names() -> list[str]:
    """Every run recorded here, by name."""
    folder = home() / "runs"
    return sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []


def create(name: str, remote: str, endpoint_url: str | None, job_id: str) -> RunRecord:
    """Record a new run with its first job; when another submit recorded it meanwhile, add the job to that record
    (RunError only when that run writes elsewhere: the job, submitted already, writes to `remote` all the same)."""
    record = RunRecord(name, remote, endpoint_url, time.time(), [job_id])
    path = _path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        known = load(name)
        if known is None or known.remote != remote:
            raise RunError(f"{path}: run {name} was recorded meanwhile by another submit at "
                           f"{known.remote if known else 'an unknown location'}; job {job_id} writes to {remote} "
                           "all the same") from None
        return add_job(known, job_id)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(record), indent=1) + "\n")
    return record


def add_job(record: RunRecord, job_id: str) -> RunRecord:
    """The run with `job_id` as its newest job, recorded."""
    record = replace(record, jobs=[*record.jobs, job_id])
    replace_text(_path(record.name), json.dumps(asdict(record), indent=1) + "\n")
    return record
