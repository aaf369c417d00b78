"""One probe step over all the nodes: a node is judged only once the step exists (slurm_titan.node.srun_probe).

`srun` here is a shim on PATH that prints what the real one prints with `-v` (recorded on the bundled cluster:
"srun: launching StepId=..." once the step exists, then each task's line), after a step-creation delay of our
choosing; a node in DEAD never starts its task."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_titan.node import srun_probe

SHIM = """#!/bin/sh
sleep "${CREATE_S:-0}"
echo "srun: jobid 7: nodes(3):\\`n[1-3]', cpu counts: 1(x3)"
for host in $(echo "$@" | sed -n 's/.*--nodelist=\\([^ ]*\\).*/\\1/p' | tr , ' '); do
    echo "srun: launching StepId=7.1 on host $host, 1 tasks: 0" >&2
    case " $DEAD " in *" $host "*) ;; *) echo "slurm-titan-probe $host" ;; esac
done
[ -n "$DEAD" ] && exec sleep 60
exit 0
"""


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    srun = tmp_path / "srun"
    srun.write_text(SHIM)
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return srun


def test_every_node_answers(shim: Path) -> None:
    assert srun_probe.probe_failures(["n1", "n2", "n3"]) == set()


def test_the_node_that_starts_no_task_is_named(shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEAD", "n2")
    assert srun_probe.probe_failures(["n1", "n2", "n3"], timeout_s=0.5) == {"n2"}


def test_a_slow_step_creation_marks_no_healthy_node_lost(shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREATE_S", "1.5")  # longer than the nodes' own time to answer
    assert srun_probe.probe_failures(["n1", "n2", "n3"], timeout_s=0.2) == set()


def test_a_step_never_created_judges_every_node(shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREATE_S", "30")
    assert srun_probe.probe_failures(["n1", "n2"], timeout_s=0.2, creation_s=0.5) == {"n1", "n2"}


def test_one_srun_whatever_the_node_count() -> None:
    command = srun_probe.probe_command([f"n{i}" for i in range(512)])
    assert command.count("srun") == 1 and "--nodes=512" in command and "--ntasks-per-node=1" in command


def test_no_host_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert srun_probe.probe_failures([]) == set()
