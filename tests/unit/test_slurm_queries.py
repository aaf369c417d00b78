"""Slurm is asked of many jobs in two commands at most (slurm_titan.slurm.job_states): `scontrol` and `sacct` are
shims on PATH that log each call and print what the bundled cluster's printed (lines recorded, cut after ExitCode)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_titan import slurm

RECORDED = [
    "JobId=6226090 JobName=debug-cpu UserId=root(0) JobState=CANCELLED Reason=None Requeue=1 Restarts=0 ExitCode=0:0"
    " NodeList=n[1-2]",
    "JobId=6226091 JobName=wrap UserId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=2 ExitCode=0:0"
    " NodeList=n[1-4]",
    "JobId=6226092 JobName=other UserId=root(0) JobState=PENDING Reason=Priority Requeue=1 Restarts=0 ExitCode=0:0",
]


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "calls"
    recorded = tmp_path / "scontrol.out"
    recorded.write_text("\n".join(RECORDED) + "\n")
    for name, body in {"scontrol": f'cat {recorded}', "sacct": 'echo "6226001|COMPLETED|None|n3|0:0"'}.items():
        shim = tmp_path / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return log


def test_many_jobs_two_commands(calls: Path) -> None:
    states = slurm.job_states(["6226090", "6226091", "6226001", "7"])
    assert {job: state.state for job, state in states.items()} == {
        "6226090": "CANCELLED", "6226091": "RUNNING", "6226001": "COMPLETED"}
    assert (states["6226091"].restarts, states["6226091"].source, states["6226001"].source) == (2, "scontrol", "sacct")
    assert calls.read_text().splitlines() == ["scontrol show job -o", "sacct -X -n -P -j 6226001,7 -o "
                                              "JobIDRaw,State,Reason,NodeList,ExitCode"]


def test_one_job_asks_for_that_job_only(calls: Path) -> None:
    assert slurm.job_state("6226090").state == "CANCELLED"
    assert calls.read_text().splitlines() == ["scontrol show job -o 6226090"]
