"""The Slurm part of the scale harness on a small configuration (8 nodes, short delays): the shims answer in the
formats the project's code parses, and a row's scenarios conclude as they should (tools/bench/scale_sim/slurm.py).
Counts and outcomes only: the times are the benchmark's."""

import os
import subprocess

import pytest

from slurm_titan import slurm as slurm_commands
from slurm_titan.node.srun_probe import probe_command, probe_failures
from tools.bench.scale_sim import hangs, slurm
from tools.bench.scale_sim.slurm_shims import Cluster, Job, environment, install, most_in_flight, read_calls, starts


@pytest.fixture
def shims(tmp_path, monkeypatch):
    """The shims on PATH over the state folder it returns (its scenario still to write)."""
    state = tmp_path / "slurm"
    for name, value in environment(install(tmp_path / "bin"), os.environ["PATH"], state, 0.0, 0.0).items():
        monkeypatch.setenv(name, value)
    return state


def test_srun_creates_the_step_then_answers_for_the_live_nodes_only(shims):
    Cluster("7", dead=["n2"]).write(shims)
    result = subprocess.run(probe_command(["n1", "n2", "n3"]), capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "Task launch for StepId=7.0 failed on node n2" in result.stderr
    assert "srun: launching StepId=7.0 on host n3, 1 tasks: 2" in result.stderr
    assert result.stdout.splitlines() == ["slurm-titan-probe n1", "slurm-titan-probe n3"]
    assert probe_failures(["n1", "n2", "n3"]) == {"n2"}  # the real probe, its step 7.1
    calls = read_calls(shims)
    assert starts(calls, "srun") == 2 and most_in_flight(calls, "srun") == 1
    assert len([c for c in calls if c.event == "end"]) == 2  # the second one killed by the probe, or ended


def test_slurm_states_come_from_scontrol_then_accounting(shims):
    known = [Job("1", "RUNNING", ["n1", "n2"], "n1"), Job("2", "FAILED", ["n3"], forgotten=True)]
    Cluster("7", jobs=known).write(shims)
    states = slurm_commands.job_states(["1", "2", "3"])
    assert (states["1"].state, states["1"].source, states["1"].nodes) == ("RUNNING", "scontrol", "n1,n2")
    assert (states["2"].state, states["2"].source) == ("FAILED", "sacct") and "3" not in states
    assert starts(read_calls(shims), "scontrol", "sacct") == 2


def test_the_tie_has_an_answer_with_every_clock_right(tmp_path):
    with hangs.rank_processes(tmp_path / "frames") as pids:
        assert hangs.named(tmp_path, 8, hangs.Case("tie"), pids)


def test_a_row_of_8_nodes_concludes_every_scenario(tmp_path):
    row = slurm.row(64, tmp_path, slurm.QUICK)
    assert row["nodes"] == 8
    assert row["dead_node_blamed"] == 1 and row["sruns_node_lost"] == 1  # the watcher's probe round, not finish's
    assert row["queries_node_lost"] == 1  # finish's node states: the survivors saw the batch shell's heartbeat
    assert row["batch_host_requeued"] == 1 and row["sruns_batch_host_lost"] == 1  # one survivor claimed the probe
    assert row["queries_batch_host_lost"] == 2  # its scontrol show job and requeue
    assert row["sruns_in_flight"] == 1
    assert row["slow_crash_blamed"] == 1 and row["healthy_lost"] == 0
    assert 1 <= row["status_queries"] <= 2 and 1 <= row["runs_queries"] <= 2
    assert row["logs_queries_per_check"] == 1 and row["logs_checks"] == 1  # the followed job has ended
    assert row["culprit_right_stacks"] == 1 and row["culprit_right_steps"] == 1  # no clock decides these
    assert row["culprit_right_tie"] == 1  # the batch shell's clock decides: one node's 5 s off does not
