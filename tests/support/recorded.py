"""The recorded run folders of tests/data/runs (see its README), and the fixtures that replay them: `utc` (the
recorded logs' clock) and `submitted_runs` (the three runs as jobs 101..103). Import a fixture into the test
module that uses it; they are not registered for every test."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_titan import slurm
from slurm_titan.records import jobs
from tests.support.paths import DATA

RUNS = DATA / "runs"


def recorded(name: str, tmp_path: Path) -> tuple[Path, float, float]:
    """A copy of a recorded run folder with its trained-step files' mtimes set; (folder, submitted, now)."""
    folder = Path(shutil.copytree(RUNS / name, tmp_path / name))
    fixture = json.loads((folder / "fixture.json").read_text())
    for rel, mtime in fixture["mtimes"].items():
        os.utime(folder / rel, (mtime, mtime))
    return folder, fixture["submitted"], fixture["now"]


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """The recorded logs' timestamps are UTC: read them as local time in UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def submitted_runs(tmp_path, monkeypatch):
    """The three recorded runs as jobs 101..103 submitted from here; Slurm has forgotten them."""
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(slurm, "job_state", lambda job_id: None)
    folders = {}
    for n, name in enumerate(["preempted-requeued", "crash-restart", "node-lost-running"]):
        folder, submitted, _ = recorded(name, tmp_path)
        job = str(101 + n)
        path = jobs.save(jobs.JobRecord(job, name, str(folder), "job.yaml", 2, submitted))
        os.utime(path, (submitted + n, submitted + n))  # jobs.recent: newest first
        folders[name] = folder
    return folders
