"""The node ledger: atomic appends from many jobs, the avoidance rules, bad input, `slurm-titan nodes`."""

import json
import multiprocessing
import select
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_titan import slurm
from slurm_titan.failure_kinds import HARDWARE, NETWORK, PEER, RETRY, UNKNOWN, USER
from slurm_titan.records import ledger
from slurm_titan.records.ledger import Entry
from tests.support.paths import REPO

HOUR = 3600.0


def entry(node: str, at: float, kind: str, job: str = "7") -> Entry:
    return Entry(node, at, job, kind, f"crashed on {node} rank 1 with SIGKILL", False)


def _append_many(path: str, worker: int) -> None:
    for number in range(50):
        ledger.record(Path(path), Entry(f"n{worker}", float(number), str(worker), NETWORK, "x" * 900, False))


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "c.jsonl"
    workers = [multiprocessing.Process(target=_append_many, args=(str(path), worker)) for worker in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    entries = ledger.read(path)
    assert len(entries) == 300
    assert sorted({e.node for e in entries}) == [f"n{w}" for w in range(6)]


def test_a_long_cause_is_cut_to_one_atomic_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert ledger.record(path, Entry("n1", 1.0, "7", HARDWARE, "é" * 5000, True))
    assert len(path.read_bytes()) < select.PIPE_BUF
    assert ledger.read(path)[0].cause.startswith("é" * 100) and ledger.read(path)[0].excluded is True


def test_a_corrupt_line_is_skipped_with_one_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.jsonl"
    ledger.record(path, entry("n1", 1.0, HARDWARE))
    with path.open("a") as file:
        file.write('{"node": "n2", "ti\n')  # a writer that died mid-line
    ledger.record(path, entry("n3", 2.0, USER))
    assert [e.node for e in ledger.read(path)] == ["n1", "n3"]
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"slurm-titan: WARNING: {path}:2: not a ledger entry")


def test_an_unwritable_ledger_is_one_warning_and_the_run_goes_on(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "home").write_text("a file where the ledger's folder should be")
    path = tmp_path / "home" / "nodes" / "c.jsonl"
    assert ledger.record(path, entry("n1", 1.0, HARDWARE)) is False
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and f"cannot record node n1's failure in {path}" in warnings[0]


def test_a_hardware_failure_is_avoided_for_the_period() -> None:
    entries = [entry("n1", 10.0, HARDWARE), entry("n2", 10.0, NETWORK)]
    assert ledger.avoid(entries, now=11.0) == {"n1": 10.0 + 24 * HOUR}
    assert ledger.avoid(entries, now=11.0, period_s=HOUR) == {"n1": 10.0 + HOUR}
    assert ledger.avoid(entries, now=10.0 + 24 * HOUR + 1) == {}


def test_two_failures_within_the_window_are_avoided_but_not_two_code_bugs() -> None:
    entries = [entry("n1", 0.0, NETWORK), entry("n1", 0.5 * HOUR, UNKNOWN),  # twice within 1 h
               entry("n2", 0.0, UNKNOWN), entry("n2", 2 * HOUR, UNKNOWN),  # 2 h apart
               entry("n3", 0.0, USER), entry("n3", 60.0, USER),  # the user's code, twice
               entry("n4", 0.0, USER), entry("n4", 60.0, NETWORK),
               entry("n5", 0.0, NETWORK), entry("n5", 60.0, USER)]
    assert ledger.avoid(entries, now=2 * HOUR) == {"n1": 0.5 * HOUR + 24 * HOUR}


def test_a_peer_fault_recorded_on_the_node_that_saw_it_says_nothing_about_that_node() -> None:
    """A 507055 that named no peer is recorded on the reporting node as `peer`: never avoided for it; one
    that named the peer is recorded on the peer's node as hardware (attribution.NodeFailure.blamed)."""
    entries = [entry("n1", 0.0, PEER), entry("n1", 60.0, PEER), entry("n2", 0.0, PEER), entry("n2", 60.0, NETWORK),
               entry("n3", 0.0, RETRY), entry("n3", 60.0, RETRY), entry("n4", 0.0, HARDWARE)]
    assert ledger.avoid(entries, now=120.0) == {"n3": 60.0 + 24 * HOUR, "n4": 24 * HOUR}


def test_keep_off_leaves_room_for_the_job() -> None:
    avoided = {"n1": 5.0, "n2": 9.0, "n3": 7.0}
    assert ledger.keep_off(avoided, total_nodes=10, wanted=4) == ["n1", "n2", "n3"]
    assert ledger.keep_off(avoided, total_nodes=4, wanted=2) == ["n2", "n3"]
    assert ledger.keep_off(avoided, total_nodes=2, wanted=2) == []


def test_summary_per_node() -> None:
    entries = [entry("n1", 10.0, HARDWARE), entry("n1", 20.0, NETWORK), entry("n2", 30.0, USER)]
    rows = ledger.summary(entries, now=40.0)
    assert [(r.node, r.failures, r.kinds, r.last_seen, r.excluded_until) for r in rows] == [
        ("n1", 2, {HARDWARE: 1, NETWORK: 1}, 20.0, 20.0 + 24 * HOUR),  # the second failure within 1 h
        ("n2", 1, {USER: 1}, 30.0, None)]


def test_cluster_name_from_the_job_or_from_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ledger.cluster_name({"SLURM_CLUSTER_NAME": "titan"}) == "titan"
    shown = "Configuration data as of 2026-12-01T10:00:00\nClusterName             = ascend64\nControlMachine = c0\n"
    monkeypatch.setattr(slurm, "run", lambda argv, check=True: subprocess.CompletedProcess(argv, 0, shown, ""))
    assert ledger.cluster_name({}) == "ascend64"


def test_hooks_write_and_read_this_clusters_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path))
    env = {"SLURM_CLUSTER_NAME": "a"}
    assert ledger.record_failure("n2", "7", HARDWARE, "crashed on n2", True, env=env, now=100.0)
    assert (tmp_path / "nodes" / "a.jsonl").is_file()
    assert ledger.avoid_now(env, now=200.0) == {"n2": 100.0 + 24 * HOUR}
    assert ledger.avoid_now({"SLURM_CLUSTER_NAME": "b"}, now=200.0) == {}  # per cluster
    monkeypatch.setattr(slurm, "run", lambda argv, check=True: subprocess.CompletedProcess(argv, 0, "", ""))
    assert ledger.record_failure("n2", "7", HARDWARE, "x", True, env={}) is False
    assert "node ledger not written: cluster name unknown" in capsys.readouterr().err


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SLURM_TITAN_HOME": str(home), "SLURM_CLUSTER_NAME": "c"}
    return subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_nodes_command_prints_the_summary(tmp_path: Path) -> None:
    assert _cli(["nodes"], tmp_path).stdout.startswith("no node failures recorded on cluster c")
    ledger.record(tmp_path / "nodes" / "c.jsonl", entry("n2", 1.0e9, HARDWARE))
    table = _cli(["nodes"], tmp_path).stdout.splitlines()
    assert table[0].split() == ["NODE", "FAILURES", "KINDS", "LAST", "SEEN", "EXCLUDED", "UNTIL"]
    assert table[1].split()[:3] == ["n2", "1", "hardware:1"]
    shown = json.loads(_cli(["nodes", "--json"], tmp_path).stdout)
    assert shown["cluster"] == "c" and shown["nodes"][0]["kinds"] == {HARDWARE: 1}


def test_nodes_command_imports_no_torch(tmp_path: Path) -> None:
    probe = ("import sys, runpy\nsys.argv = ['slurm-titan', 'nodes']\ntry:\n"
             "    runpy.run_module('slurm_titan.cli.main', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('HEAVY:', [m for m in ('torch', 'torchtitan', 'torch_npu') if m in sys.modules],\n"
             "      file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "SLURM_TITAN_HOME": str(tmp_path), "SLURM_CLUSTER_NAME": "c"})
    assert "HEAVY: []" in result.stderr, result.stderr
