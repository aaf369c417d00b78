"""A SIGTERM after another node of the attempt reported a failure is srun ending the step: the node's ranks are
killed at once, with no stop file (a save could not complete without the failed node's ranks, and would wait for
them until Slurm's KillWait ran out). Without such a report (a preemption, a cancel) the ranks are asked to save."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_titan.errors import ExitCode
from slurm_titan.node.supervisor.rendezvous import Rendezvous
from slurm_titan.node.supervisor.supervisor import NodeSupervisor, RankGroup
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from tests.support.paths import repo_pythonpath

STUCK = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: None); "
         "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)")
"""A rank whose save waits on a peer that is gone: a SIGTERM does not end it (it says so by a file once it holds)."""
RDZV = Rendezvous("127.0.0.1", 29500, node_rank=0, num_nodes=2, procs_per_node=1, hosts=("a", "b"))


@pytest.mark.parametrize(("other_report", "torn_down"), [
    ({"exit_code": 137}, True), ({"exit_code": ExitCode.HANG}, True), ({"exit_code": ExitCode.PREEMPTED}, False),
    (None, False)])
def test_a_sigterm_after_another_nodes_failure_kills_the_ranks_at_once(tmp_path: Path, other_report: dict | None,
                                                                      torn_down: bool) -> None:
    supervisor = NodeSupervisor(spec=None)  # type: ignore[arg-type]  # the handler reads nothing of the spec
    supervisor.attempt_dir = attempt_dir = HeldFolder(run_folder.attempt_folder(tmp_path, 0))
    supervisor.stop_file = run_folder.stop_file(tmp_path, 0, 0)
    ready = tmp_path / "holds"
    supervisor.ranks = ranks = RankGroup([sys.executable, "-c", STUCK, str(ready)], repo_pythonpath(), RDZV,
                                         tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if other_report is not None:
            attempt_dir.replace_text(run_folder.node_report_name(1), json.dumps({"host": "b", **other_report}))
        attempt_dir.replace_text(run_folder.node_report_name(0), json.dumps({"exit_code": 1}))  # its own: not another's
        supervisor._on_signal(signal.SIGTERM, None)
        process = ranks.processes[0]
        if torn_down:
            assert process.wait(timeout=30) == -signal.SIGKILL
            assert not supervisor.stop_file.exists()
        else:
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=2)
            assert supervisor.stop_file.read_text() == "SIGTERM"
        assert supervisor.terminated
    finally:
        ranks.kill()
