"""The recorded run folders of tests/data/runs (see its README), and the fixtures that replay them: `utc` (the
recorded logs' clock) and `submitted_runs` (the three runs as jobs 101..103); `resumed_run` makes 101 the first
job of run `exp`. Import a fixture into the test module that uses it; they are not registered for every test."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_titan import slurm
from slurm_titan.launch import goodput
from slurm_titan.records import jobs, run_registry
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


def resumed_run(first: Path, folder: Path) -> goodput.Goodput:
    """Job 101 (steps 1..100, ended at 1735727100) and job 104 resuming it, as run `exp`; 101's goodput alone."""
    folder.mkdir()
    events = [{"attempt": 0, "event": "start", "hosts": ["n1", "n2"], "time": 1735727400.0},  # 300 s after 101
              {"attempt": 0, "event": "first-step", "step": 101, "time": 1735727460.0},
              {"action": "stop", "attempt": 0, "cause": None, "culprit": None, "event": "end", "excluded": [],
               "exit_code": 0, "note": None, "progressed": True, "reason": "finished", "time": 1735727760.0,
               "trained_step": 150}]
    (folder / "history.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    (folder / "logs").mkdir()
    (folder / "logs/rank-0.log").write_text("".join(  # UTC, as the recorded logs
        f"2025-01-01 10:{31 + (step - 101) // 10:02d}:00,000 - root - INFO - step: {step}  loss:  2.5000  tps: 900\n"
        for step in range(101, 151, 10)))
    jobs.save(dataclasses.replace(jobs.load("101"), run="exp", remote="s3://b/exp"))
    jobs.save(jobs.JobRecord("104", "preempted-requeued", str(folder), "job.yaml", 2, 1735727200.0, "exp",
                             "s3://b/exp"))
    run_registry.add_job(run_registry.create("exp", "s3://b/exp", None, "101"), "104")
    return goodput.measure(first, jobs.load("101").submitted)
