"""The next attempt's srun step started ahead of the batch shell's decision: started on the first failure report
(or, a standby step, on the attempt's first trained step), told to go when the restart runs on its nodes, ended
otherwise (a stand-in srun on PATH)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_titan.node.batch import ahead, allocation, step_watch
from slurm_titan.node.batch.allocation import AttemptPlan
from slurm_titan.records import history, run_folder
from tests.support.reports import node_report


@pytest.fixture
def job_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A job folder with a submission script whose srun is a stand-in: it notes what it was started with, then
    waits for its word (as the supervisors would) and exits 0 on go, 3 otherwise."""
    job_dir, bin_dir = tmp_path / "job", tmp_path / "bin"
    job_dir.mkdir(), bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"""#!/bin/sh
d={job_dir}/attempts/$SLURM_TITAN_ATTEMPT_INDEX
echo "$SLURM_TITAN_NODES $SLURM_TITAN_STARTED_AHEAD $SUBMITIT_EXECUTOR ${{SLURM_TITAN_STANDBY:-0}}" > $d/started-with
for i in $(seq 100); do
  grep -q true $d/{run_folder.AHEAD_WORD} 2>/dev/null && exit 0
  grep -q false $d/{run_folder.AHEAD_WORD} 2>/dev/null && exit 3
  sleep 0.1
done
exit 4
""")
    (bin_dir / "srun").chmod(0o755)
    (job_dir / "42_submission.sh").write_text("#!/bin/bash\n# command\nexport SUBMITIT_EXECUTOR=slurm\n"
                                              "srun --nodes=$SLURM_TITAN_NUM_NODES x\n# teardown\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield job_dir


def _started(job_dir: Path, nodes: tuple[str, ...], standby: bool = False) -> threading.Thread:
    """Attempt 0 failed (or, `standby`, trains): the step of attempt 1 started ahead on `nodes`."""
    run_folder.attempt_folder(job_dir, 0).mkdir(parents=True, exist_ok=True)
    recorder = ahead.start_ahead(job_dir, "42", 0, nodes, dict(os.environ), standby)
    folder = run_folder.attempt_folder(job_dir, 1)
    deadline = time.monotonic() + 10
    while not (folder / "started-with").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return recorder


def test_a_step_started_ahead_on_the_restarts_nodes_is_told_to_go_and_waited_for(
        job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "unhealthy_nodes", lambda hosts: set())
    _started(job_dir, ("n1", "n2"))
    assert (run_folder.attempt_folder(job_dir, 1) / "started-with").read_text() == "n1,n2 0 slurm 0\n"  # follows 0
    step = ahead.find(job_dir, 0)
    assert step is not None and (step.attempt, step.nodes) == (1, ("n1", "n2"))  # attempt 1 claimed as it started
    assert allocation.next_attempt(job_dir, 2, {"SLURM_JOB_NODELIST": "n[1-2]"}, number=step.attempt) == \
        AttemptPlan(1, ("n1", "n2"))
    assert ahead.step_for(job_dir, 0, AttemptPlan(1, ("n1", "n2"))) == step
    assert step.wait() == 0  # the stand-in saw the word to go


def test_a_standby_step_is_marked_so_its_ranks_import_at_the_background_priority(job_dir: Path) -> None:
    recorder = _started(job_dir, ("n1",), standby=True)
    assert (run_folder.attempt_folder(job_dir, 1) / "started-with").read_text() == "n1 0 slurm 1\n"
    ahead.dismiss(job_dir, 0)
    recorder.join(10)


def test_a_step_started_ahead_on_other_nodes_is_ended_and_a_new_one_is_needed(job_dir: Path) -> None:
    recorder = _started(job_dir, ("n1", "n2"))
    assert ahead.step_for(job_dir, 0, AttemptPlan(1, ("n2", "n3"))) is None  # n1 left out: the spare n3 instead
    recorder.join(10)
    assert json.loads((run_folder.attempt_folder(job_dir, 1) / run_folder.AHEAD_WORD).read_text()) == {"go": False}
    assert (run_folder.attempt_folder(job_dir, 0) / run_folder.AHEAD_EXIT).read_text() in ("3", "-9")  # told, killed
    ahead.dismiss(job_dir, 0)  # once ended, nothing more to do


def test_a_step_started_after_a_standby_that_ended_is_not_taken_for_ended(job_dir: Path) -> None:
    folder = run_folder.attempt_folder(job_dir, 0)
    folder.mkdir(parents=True)
    (folder / run_folder.AHEAD_EXIT).write_text("0")  # the standby's, ended before the failure
    recorder = _started(job_dir, ("n1",))
    step = ahead.find(job_dir, 0)
    assert step is not None and step.attempt == 1 and step.exit_code() is None
    ahead.dismiss(job_dir, 0)
    recorder.join(10)


def test_the_decision_finds_a_step_being_started_and_none_starts_after_it(job_dir: Path) -> None:
    # The first attempt's watcher (a process of its own) may be starting a step as the batch shell decides: a start
    # in progress (here: its lock held, its record not yet written) holds the decision until the record is there
    folder = run_folder.attempt_folder(job_dir, 0)
    folder.mkdir(parents=True)
    found: list[ahead.AheadStep | None] = []
    with ahead.job_lock(job_dir):
        deciding = threading.Thread(target=lambda: found.append(ahead.decide(job_dir, 0)))
        deciding.start()
        deciding.join(0.3)
        assert deciding.is_alive()  # waits for the start in progress
        (folder / run_folder.AHEAD).write_text(json.dumps({"attempt": 1, "pid": os.getpid(), "nodes": ["n1"]}))
    deciding.join(10)
    assert found == [ahead.AheadStep(folder, 1, os.getpid(), ("n1",))]
    (folder / run_folder.AHEAD).unlink()
    assert ahead.start_ahead(job_dir, "42", 0, ("n1",), dict(os.environ)) is None  # decided: too late to start
    assert not (run_folder.attempt_folder(job_dir, 1) / "started-with").exists() and ahead.find(job_dir, 0) is None


def test_the_lock_of_a_holder_killed_outright_is_free_and_left_nowhere(tmp_path: Path) -> None:
    # A batch shell cancelled outright (scancel, its node lost) never releases the lock: its process's death does,
    # and no file is left behind in /tmp or anywhere else
    job_dir = tmp_path / "job"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from slurm_titan.node.batch import ahead\n"
                               "with ahead.job_lock(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(60)",
                               str(job_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    taken = threading.Event()

    def take() -> None:
        with ahead.job_lock(job_dir):
            taken.set()

    threading.Thread(target=take, daemon=True).start()
    assert not taken.wait(0.3)  # held by the other process
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert taken.wait(10)
    assert not list(tmp_path.iterdir())


def test_no_step_started_ahead_is_none(job_dir: Path) -> None:
    assert ahead.step_for(job_dir, 0, AttemptPlan(1, ("n1", "n2"))) is None
    ahead.dismiss(job_dir, 0)


def test_the_first_failure_report_starts_the_next_attempt_ahead_once(tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "1.5"])
    node_report(tmp_path, 0, 1, "n2", 0, None)  # n2 finished: nothing to start
    calls: list[float] = []
    timers = [threading.Timer(0.3, node_report, (tmp_path, 0, 0, "n1", 137, {"rank": 0, "exit_code": -9, "time": 1})),
              threading.Timer(0.6, node_report, (tmp_path, 0, 2, "n3", 1, {"rank": 2, "exit_code": 1, "time": 2}))]
    for timer in timers:
        timer.start()
    started = time.monotonic()
    step_watch.watch(tmp_path, 0, ["n1", "n2", "n3"], srun.pid, grace_s=5, poll_s=1.0, probe=lambda _: set(),
                     start_next=lambda _standby: calls.append(time.monotonic() - started))
    assert len(calls) == 1 and 0.3 <= calls[0] < 0.3 + 0.5  # at its sighting, not the watcher's next 1 s poll


@pytest.mark.parametrize("code", [0, 75, 78])  # finished, checkpointed to stop, a preflight failure
def test_reports_of_no_failure_start_nothing_ahead(tmp_path: Path, code: int) -> None:
    srun = subprocess.Popen(["sleep", "0.5"])
    node_report(tmp_path, 0, 0, "n1", code, None)
    calls: list[bool] = []
    step_watch.watch(tmp_path, 0, ["n1"], srun.pid, grace_s=5, poll_s=0.05, probe=lambda _: set(),
                     start_next=lambda _standby: calls.append(True))
    assert calls == []


@pytest.mark.parametrize("standby", ["off", "on", "on, ended early"])
def test_a_standby_step_is_started_once_as_the_attempt_trains_its_first_step(tmp_path: Path, standby: str) -> None:
    srun = subprocess.Popen(["sleep", "3"])  # ends well after the failure's sighting, on a loaded machine too
    folder = run_folder.attempt_folder(tmp_path, 0)
    folder.mkdir(parents=True)
    failed = run_folder.node_report(tmp_path, 0, 0)
    calls: list[tuple[bool, bool]] = []  # whether the failure was reported when the next step was started; standby?
    timers = [threading.Timer(0.2, history.write_trained_step, (tmp_path, 0, 1)),
              threading.Timer(1.2, node_report, (tmp_path, 0, 0, "n1", 137, {"rank": 0, "exit_code": -9, "time": 1}))]
    if standby == "on, ended early":  # its srun's exit code recorded (a rank of it lost, say) before the failure
        timers.append(threading.Timer(0.6, (folder / run_folder.AHEAD_EXIT).write_text, ("0",)))
    for timer in timers:
        timer.start()
    step_watch.watch(tmp_path, 0, ["n1"], srun.pid, grace_s=5, poll_s=1.0, probe=lambda _: set(),
                     start_next=lambda stands_by: calls.append((failed.exists(), stands_by)), standby=standby != "off")
    # on: at the first trained step, and the failure after it starts no second one, unless that one ended meanwhile;
    # only the one started as the attempt trains is a standby step (its ranks import at the background priority)
    assert calls == {"off": [(True, False)], "on": [(False, True)],
                     "on, ended early": [(False, True), (True, False)]}[standby]


def test_a_step_whose_srun_ended_without_a_code_written_ended_failed_and_is_not_killed_again(
        job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    run_folder.attempt_folder(job_dir, 0).mkdir(parents=True)
    step = ahead.AheadStep(run_folder.attempt_folder(job_dir, 0), 1, gone.pid, ("n1",))
    monkeypatch.setattr(ahead, "EXIT_GRACE_S", 0.2)
    assert step.wait() == 1
    unrelated = subprocess.Popen(["sleep", "5"])  # its pid, were it the recorded one, is not an srun's: left alone
    (run_folder.attempt_folder(job_dir, 0) / run_folder.AHEAD).write_text(
        json.dumps({"attempt": 1, "pid": unrelated.pid, "nodes": ["n1"]}))
    ahead.dismiss(job_dir, 0)
    assert unrelated.poll() is None
    unrelated.kill()
