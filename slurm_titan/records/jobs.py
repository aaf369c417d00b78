"""Where the login node remembers submitted jobs: one JSON file per job id.

`$SLURM_TITAN_HOME/jobs/<id>.json` (default `~/.slurm-titan`) maps a job id to its folder,
config and name, so `status`, `logs` and `cancel` take just the id; and to its run and checkpoint
location (records.run_registry), None in records written before runs had names.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan import envvars
from slurm_titan.errors import SlurmTitanError
from slurm_titan.records.whole_file import replace_text


def home() -> Path:
    return Path(os.environ.get(envvars.HOME, Path.home() / ".slurm-titan"))


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    name: str
    job_dir: str
    config: str
    nodes: int
    submitted: float
    run: str | None = None
    remote: str | None = None

    @property
    def folder(self) -> Path:
        return Path(self.job_dir)


def save(record: JobRecord) -> Path:
    path = home() / "jobs" / f"{record.job_id}.json"
    replace_text(path, json.dumps(asdict(record), indent=1) + "\n")
    return path


def load(job_id: str) -> JobRecord:
    path = home() / "jobs" / f"{job_id}.json"
    try:
        return JobRecord(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise SlurmTitanError(f"job {job_id} was not submitted by slurm-titan from here (no {path})") from None


def recent(limit: int = 20) -> list[JobRecord]:
    folder = home() / "jobs"
    if not folder.is_dir():
        return []
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
    return [JobRecord(**json.loads(p.read_text(encoding="utf-8"))) for p in paths]


def find(job_id: str) -> JobRecord | None:
    """The record of `job_id`, None when there is none."""
    try:
        return load(job_id)
    except SlurmTitanError:
        return None


def new_record(job_id: str, name: str, job_dir: Path, config: str, nodes: int, run: str | None = None,
               remote: str | None = None) -> JobRecord:
    return JobRecord(job_id, name, str(job_dir), config, nodes, time.time(), run, remote)
