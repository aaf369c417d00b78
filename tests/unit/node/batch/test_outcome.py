"""Why an attempt ended and whether it requeues: the decision table, the node reports, the history."""

import json
import os
from pathlib import Path

import pytest

from slurm_titan.errors import ExitCode
from slurm_titan.node.batch.attribution import read_reports
from slurm_titan.node.batch.finish import attempt_exit_code
from slurm_titan.node.batch.outcome import REQUEUE, RESTART, STOP, Outcome, RunSoFar, decide
from slurm_titan.node.batch_spec import RetryPolicy
from slurm_titan.node.supervisor.supervisor import node_exit_code
from slurm_titan.records import history, run_folder
from tests.support.batch_specs import write_batch_spec

POLICY = RetryPolicy(max_requeues=3, max_failures=5, max_failures_without_progress=3)


def _run(requeues: int = 0, failures: int = 0, stalled: int = 0, progressed: bool = True) -> RunSoFar:
    return RunSoFar(requeues=requeues, failures=failures, stalled_failures=stalled, progressed=progressed)


@pytest.mark.parametrize(
    ("code", "near_limit", "run", "reason", "action"),
    [
        (0, False, _run(), "finished", STOP),
        (ExitCode.PREEMPTED, False, _run(), "preempted", REQUEUE),
        (ExitCode.PREEMPTED, True, _run(requeues=1), "timed out", REQUEUE),
        (ExitCode.PREEMPTED, False, _run(requeues=3), "preempted", STOP),  # max_requeues reached
        (1, False, _run(), "failed", RESTART),  # unplanned failures are retried by default
        (137, False, _run(failures=4, stalled=2), "failed", RESTART),  # progress resets the loop count
        (1, False, _run(failures=2, stalled=1, progressed=False), "failed", RESTART),
        (1, False, _run(failures=2, stalled=2, progressed=False), "restart loop", STOP),  # 3rd in a row
        (1, False, _run(failures=5), "failed", STOP),  # max_failures over the run
        (ExitCode.PREFLIGHT, False, _run(), "preflight failed", STOP),
        (ExitCode.PREFLIGHT, True, _run(), "preflight failed", STOP),
    ],
)
def test_decision_table(code: int, near_limit: bool, run: RunSoFar, reason: str, action: str) -> None:
    outcome = decide(code, near_limit, run, POLICY)
    assert (outcome.reason, outcome.action) == (reason, action)


def test_a_transient_preflight_failure_is_retried_as_a_failure_within_the_caps() -> None:
    stalled = _run(progressed=False)
    assert decide(ExitCode.PREFLIGHT, False, stalled, POLICY, retry_preflight=True) == \
        Outcome("failed", RESTART, "a transient preflight failure without progress")
    assert decide(ExitCode.PREFLIGHT, False, _run(failures=2, stalled=2, progressed=False), POLICY,
                  retry_preflight=True).reason == "restart loop"
    assert decide(ExitCode.PREFLIGHT, False, _run(failures=5), POLICY, retry_preflight=True).action == STOP
    assert decide(ExitCode.PREFLIGHT, False, stalled, POLICY) == \
        Outcome("preflight failed", STOP, "a node failed the preflight: not retried")


def test_crash_is_retried_by_default_and_a_loop_is_named() -> None:
    from slurm_titan.launch.config import PreemptionSpec

    spec = PreemptionSpec()
    policy = RetryPolicy(max_requeues=spec.max_requeues, max_failures=spec.max_failures,
                         max_failures_without_progress=spec.max_failures_without_progress)
    assert decide(1, False, _run(), policy).action == RESTART
    loop = decide(1, False, _run(failures=2, stalled=2, progressed=False), policy)
    assert loop.reason == "restart loop" and "3 failed attempts in a row without progress" in loop.note


@pytest.mark.parametrize(
    ("ranks", "node"),
    [({0: 0, 1: 0}, 0), ({0: ExitCode.PREEMPTED, 1: ExitCode.PREEMPTED}, ExitCode.PREEMPTED),
     ({0: ExitCode.PREEMPTED, 1: 0}, ExitCode.PREEMPTED), ({0: 0, 1: -9}, 137), ({0: 3, 1: -15}, 3)],
)
def test_node_verdict(ranks: dict[int, int], node: int) -> None:
    assert node_exit_code(ranks) == node


def _report(job_dir: Path, node: int, code: int, failure: dict | None = None) -> None:
    path = run_folder.node_report(job_dir, 0, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": f"n{node}", "exit_code": code, "ranks": {}, "first_failure": failure}))


def test_attempt_code_from_node_reports(tmp_path: Path) -> None:
    _report(tmp_path, 0, ExitCode.PREEMPTED)
    assert attempt_exit_code(read_reports(tmp_path, 0, 2), 2, 0) == 1  # node 1 never reported: killed, so failed
    _report(tmp_path, 1, 0)
    assert attempt_exit_code(read_reports(tmp_path, 0, 2), 2, 0) == ExitCode.PREEMPTED
    _report(tmp_path, 1, 9)
    assert attempt_exit_code(read_reports(tmp_path, 0, 2), 2, 137) == 9
    run_folder.node_report(tmp_path, 0, 1).write_text('{"exit_code": ')  # torn: its node was killed writing it
    assert attempt_exit_code(read_reports(tmp_path, 0, 2), 2, 0) == 1
    run_folder.attempts_folder(tmp_path / "unlistable").parent.mkdir()
    run_folder.attempts_folder(tmp_path / "unlistable").write_text("")  # not a folder: nothing can be read
    assert read_reports(tmp_path / "unlistable", 0, 2) == {}


def test_history_records_attempts_and_time_lost(tmp_path: Path) -> None:
    history.append_event(tmp_path, "start", 0, hosts=["n1", "n2"])
    history.append_event(tmp_path, "first-step", 0, step=1)
    history.append_event(tmp_path, "stopped", 0, step=9, signal="SIGUSR2", committed=True)
    history.append_event(tmp_path, "end", 0, exit_code=75, reason="preempted")
    history.append_event(tmp_path, "start", 1, hosts=["n3", "n4"])
    history.append_event(tmp_path, "first-step", 1, step=10)
    with run_folder.history_file(tmp_path).open("a") as out:
        out.write("{half a line\n")
    history.append_event(tmp_path, "last-step", 1, step=20)
    first, second = history.as_dicts(history.read_attempts(tmp_path))
    assert (first["first_step"], first["stopped_at_step"], first["stop_signal"], first["reason"]) == \
        (1, 9, "SIGUSR2", "preempted")
    assert first["time_lost_s"] >= 0 and first["last_step"] is None
    assert (second["hosts"], second["first_step"], second["last_step"], second["ended"]) == (["n3", "n4"], 10, 20, None)


def test_attempt_killed_before_its_end_record_reads_as_requeued(tmp_path: Path) -> None:
    history.append_event(tmp_path, "start", 0, hosts=["n1"])
    history.append_event(tmp_path, "stopped", 0, step=4, signal="SIGTERM", committed=True)
    history.append_event(tmp_path, "start", 1, hosts=["n1"])
    history.append_event(tmp_path, "first-step", 1, step=5)
    first, _ = history.as_dicts(history.read_attempts(tmp_path))
    assert first["reason"] == "requeued by Slurm" and "time_lost_s" in first


def test_missing_scontrol_is_an_error_not_a_silent_non_requeue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    from slurm_titan.node.batch import finish

    _report(tmp_path, 0, ExitCode.PREEMPTED)
    monkeypatch.setenv("PATH", str(tmp_path))  # a compute node without Slurm's client commands
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setattr(finish, "near_time_limit", lambda job_id, seconds: False)
    write_batch_spec(tmp_path, nodes=1, retry=RetryPolicy(max_requeues=5, max_failures=0,
                                                          max_failures_without_progress=3), signal_seconds=60)
    code = finish.main(["--job-dir", str(tmp_path), "--srun-exit-code", "0"])
    assert code == ExitCode.REQUEUE_FAILED
    assert "ERROR: scontrol not found on PATH" in capsys.readouterr().out
    assert [a.reason for a in history.read_attempts(tmp_path)] == ["preempted"]


def _fake_scontrol(folder: Path, failures: int) -> Path:
    """An `scontrol` that fails its first `failures` calls (as a busy slurmctld does); returns its call log."""
    calls = folder / "calls"
    script = folder / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                      f"[ $(wc -l < {calls}) -gt {failures} ] || "
                      "{ echo 'Socket timed out on send/recv operation' >&2; exit 1; }\n")
    script.chmod(0o755)
    return calls


def test_requeue_retries_a_busy_slurmctld(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from slurm_titan.node.batch import finish

    calls = _fake_scontrol(tmp_path, failures=2)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    finish.requeue("123", pause_s=0.01)
    assert calls.read_text().splitlines() == ["requeue 123"] * 3


def test_requeue_that_keeps_failing_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from slurm_titan.node.batch import finish

    calls = _fake_scontrol(tmp_path, failures=99)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match="failed 3 times, last: Socket timed out"):
        finish.requeue("123", tries=3, pause_s=0.01)
    assert len(calls.read_text().splitlines()) == 3
