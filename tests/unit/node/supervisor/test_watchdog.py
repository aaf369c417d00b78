"""The progress watchdog: budgets, calibration, the progress record, real stopped processes, hang attribution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurm_titan.envvars import PROGRESS_FILE
from slurm_titan.errors import ConfigError, ExitCode
from slurm_titan.launch import config as config_module
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
from slurm_titan.node import budgets
from slurm_titan.node.batch import attribution
from slurm_titan.node.budgets import Budgets, Calibration, WatchdogSpec
from slurm_titan.node.supervisor import stacks, watchdog
from slurm_titan.node.supervisor.timing import TimingReport
from slurm_titan.records import node_timing, rank_progress, run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.rank_progress import Phase, Progress
from tests.support.paths import REPO
from tests.support.reports import node_report

LIMITS = Budgets(watchdog=WatchdogSpec(startup_s=900, restore_s=800, first_step_s=700, step_floor_s=60, step_factor=3,
                                       save_s=600, upload_s=1800, stopped_s=15), step_cap_s=1140)


def test_budgets_per_phase() -> None:
    assert LIMITS.for_progress(Progress(Phase.STEP, 1, 0.0, steps_done=0), 0.0) == 700  # the first step
    assert LIMITS.for_progress(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=2.0), 0.0) == 60  # floor
    assert LIMITS.for_progress(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=30.0), 0.0) == 90
    assert LIMITS.for_progress(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=2.0), 50.0) == 150  # learned
    assert LIMITS.for_progress(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=900.0), 0.0) == 1140  # cap
    assert [LIMITS.for_progress(Progress(phase, 5, 0.0), 0.0) for phase in
            (Phase.STARTUP, Phase.RESTORE, Phase.SAVE, Phase.UPLOAD, Phase.DONE)] == [900, 800, 600, 1800, None]


def test_a_stopped_rank_has_a_shorter_budget_in_every_watched_phase() -> None:
    stopped = LIMITS.stopped_budget
    assert stopped(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=2.0), 0.0) == 15
    assert stopped(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=30.0), 0.0) == 15  # however long steps are
    assert stopped(Progress(Phase.STEP, 5, 0.0, steps_done=4, slowest_step_s=2.0), 50.0) == 15
    assert stopped(Progress(Phase.STEP, 1, 0.0, steps_done=0), 0.0) == 15  # the first step: compiling is no stop
    assert [stopped(Progress(phase, 5, 0.0), 0.0) for phase in (Phase.STARTUP, Phase.RESTORE, Phase.SAVE,
                                                                Phase.UPLOAD, Phase.DONE)] == [15] * 4 + [None]
    slow = Budgets(watchdog=WatchdogSpec(startup_s=900, restore_s=800, first_step_s=700, step_floor_s=10,
                                         step_factor=3, save_s=600, upload_s=1800, stopped_s=20), step_cap_s=1140)
    assert slow.stopped_budget(Progress(Phase.STEP, 5, 0.0, steps_done=4), 0.0) == 10  # never past the step budget


def test_calibration_survives_to_the_next_attempt(tmp_path: Path) -> None:
    assert budgets.read_calibration(tmp_path) == Calibration()  # none yet
    budgets.write_calibration(tmp_path, Calibration(41.5))
    assert budgets.read_calibration(tmp_path) == Calibration(41.5)
    run_folder.calibration_file(tmp_path).write_text("{broken")
    assert budgets.read_calibration(tmp_path) == Calibration()


def test_the_watchdog_learns_and_the_next_attempt_starts_calibrated(tmp_path: Path) -> None:
    first = watchdog.Watchdog(LIMITS, [0], tmp_path, 0, learns=True, say=lambda _: None)
    writer = rank_progress.ProgressWriter(first.rank_env(0)[PROGRESS_FILE])
    writer.enter(Phase.STEP, 1)
    writer.step_done(1)
    first.arm()
    writer._slowest = 40.0  # a slow step, without waiting 40 s
    writer.step_done(2)
    assert first.overdue({0: os.getpid()}) == []
    first.close()
    messages: list[str] = []
    second = watchdog.Watchdog(LIMITS, [0], tmp_path, 1, learns=True, say=messages.append)
    assert second.learned == 40.0 and "step budget 120 s" in messages[0]
    second.close()


def test_progress_record_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rank-3.progress"
    rank_progress.create(path, 100.0)
    assert rank_progress.read(path) == Progress(Phase.STARTUP, 0, 100.0)
    writer = rank_progress.ProgressWriter(str(path))
    writer.enter(Phase.STEP, 7)
    writer.step_done(7)
    record = rank_progress.read(path)
    assert (record.phase, record.step, record.steps_done) == (Phase.STEP, 8, 1)  # step 8 is being trained
    assert record.slowest_step_s >= 0 and record.since >= 100.0
    writer.enter(Phase.SAVE, 8)
    assert rank_progress.read(path).phase == Phase.SAVE
    sum(range(2_000_000))  # the save's work is no step's
    writer.enter(Phase.STEP, 9)
    writer.step_done(9, device=(0.125, 3))  # the chip's probes so far, as rank.device_probe.tick() gives them
    record = rank_progress.read(path)
    assert record.steps_done == 2 and 0 <= record.work_s < 0.02 and 0 <= record.wall_s < 0.02
    assert (record.device_s, record.probes) == (0.125, 3)
    node_timing.write(tmp_path, 0, node_timing.NodeTiming.of(1, "n2", {3: record, 4: record}, 200.0))
    timing = node_timing.read_all(tmp_path, 0)[1]
    assert (timing.steps, timing.device_s, timing.probes) == (4, 0.25, 6)  # the node's ranks summed
    torn = bytearray(path.read_bytes())
    torn[-1] ^= 0xFF  # the end's sequence number differs: a write in progress
    path.write_bytes(bytes(torn))
    assert rank_progress.read(path) is None
    assert rank_progress.read(tmp_path / "missing") is None


def test_budget_errors_name_the_key(tmp_path: Path) -> None:
    config = REPO / "configs" / "debug_cpu.yaml"
    for key, value, text in [("watchdog.save_s", 0, "must be >= 1, got 0"),
                             ("watchdog.step_floor_s", -5, "must be >= 1"),
                             ("watchdog.step_floor_s", 1150, r"before timeouts.collective_s \(1200 s\)"),
                             ("watchdog.first_step_s", 1790, "before timeouts.startup_s")]:
        with pytest.raises(ConfigError, match=rf"{key}.*{text}"):
            load_config(config, [(key, value)])


def test_watchdog_off_with_timeouts_past_the_time_limit_warns_once(capsys: pytest.CaptureFixture) -> None:
    load_config(REPO / "configs" / "debug_cpu.yaml", [("watchdog.enable", False)])
    assert capsys.readouterr().err.count("WARNING") == 1  # 1790 s start-up timeout >= the 20 min limit
    load_config(REPO / "configs" / "debug_cpu.yaml", [("watchdog.enable", False), ("slurm.time", "02:00:00")])
    assert capsys.readouterr().err == ""


def test_the_plan_carries_the_budgets_only_with_the_checkpoint_hook(capsys: pytest.CaptureFixture) -> None:
    config = REPO / "configs" / "debug_cpu.yaml"
    assert plan_job(load_config(config)).node.watchdog.step_cap_s == 1200 - config_module.WATCHDOG_MARGIN_S
    assert plan_job(load_config(config, [("watchdog.enable", False)])).node.watchdog is None
    capsys.readouterr()
    assert plan_job(load_config(config, [("checkpoint.enable", False), ("checkpoint.remote", None)])).node.watchdog \
        is None
    warnings = capsys.readouterr().err.splitlines()  # said at submit, in one line, not dropped silently
    assert [line for line in warnings if "no progress watchdog" in line] == [
        f"slurm-titan: WARNING: {config}: checkpoint.enable is false: the ranks report their steps from the checkpoint "
        "hook, so this job has no progress watchdog and no per-attempt step history"]


# ---- real processes ------------------------------------------------------------------------------------

RANK = textwrap.dedent("""
    import sys, time
    from slurm_titan.records import rank_progress
    from slurm_titan.rank import stacks
    from slurm_titan.records.rank_progress import Phase
    stacks.register_in_rank()
    rank_progress.enter(Phase.STEP, 1)

    def train_forever():
        step = 1
        while True:
            time.sleep(0.01)
            rank_progress.step_done(step)
            step += 1

    print("ready", flush=True)
    train_forever()
""")


def _start_rank(dog: watchdog.Watchdog, rank: int, program: str = RANK) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO)) | dog.rank_env(rank)
    child = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    return child


@pytest.mark.parametrize("method", ["py-spy", "faulthandler"])
def test_a_stopped_rank_is_detected_and_its_stack_dumped(tmp_path: Path, method: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if method == "py-spy" and stacks.py_spy() is None:
        pytest.skip("py-spy is not installed here")
    if method == "faulthandler":
        monkeypatch.setattr(stacks, "py_spy", lambda: None)
    limits = Budgets(watchdog=WatchdogSpec(startup_s=5, restore_s=5, first_step_s=5, step_floor_s=1, step_factor=3,
                                           save_s=5, upload_s=5, stopped_s=100), step_cap_s=100)
    said: list[str] = []
    dog = watchdog.Watchdog(limits, [0, 1], tmp_path, 0, learns=False, say=said.append)
    ranks = {rank: _start_rank(dog, rank) for rank in (0, 1)}
    try:
        dog.arm()
        time.sleep(0.5)
        pids = {rank: child.pid for rank, child in ranks.items()}
        assert dog.overdue(pids) == []  # both make progress
        os.kill(ranks[1].pid, signal.SIGSTOP)
        stopped_at = time.time()
        while not (late := dog.overdue(pids)):
            assert time.time() - stopped_at < 30, "the stopped rank was never found late"
            time.sleep(0.2)
        assert late == [1]
        hang = dog.investigate({rank: child.pid for rank, child in ranks.items()}, time.time())
    finally:
        for child in ranks.values():
            child.kill()
            child.wait()
        dog.close()
    assert (hang.rank, hang.phase, hang.frozen, hang.state) == (1, "step", True, "T")
    assert hang.since <= stopped_at and hang.step > 1
    text = (tmp_path / "attempts" / "0" / "stacks" / "node-0.txt").read_text()
    rank0, _, rank1 = text.removeprefix("==> rank 0 <==\n").partition("==> rank 1 <==\n")
    assert "train_forever" in rank1 and rank0.strip(), text
    assert f"(by {method}" in said[-1] and (method == "py-spy" or "py-spy missing" in said[-1])


def test_a_stopped_rank_is_hung_after_the_stopped_budget_a_sleeping_one_only_after_the_step_floor(
        tmp_path: Path) -> None:
    limits = Budgets(watchdog=WatchdogSpec(startup_s=5, restore_s=5, first_step_s=5, step_floor_s=60, step_factor=3,
                                           save_s=5, upload_s=5, stopped_s=1), step_cap_s=100)
    dog = watchdog.Watchdog(limits, [0, 1], tmp_path, 0, learns=False, say=lambda _: None)
    sleeper = RANK.replace("train_forever()\n", "rank_progress.step_done(1)\ntime.sleep(600)\n")
    ranks = {0: _start_rank(dog, 0, sleeper), 1: _start_rank(dog, 1)}  # 0: no progress, but sleeping (S)
    pids = {rank: child.pid for rank, child in ranks.items()}
    try:
        dog.arm()
        time.sleep(0.5)
        assert dog.overdue(pids) == []
        os.kill(pids[1], signal.SIGSTOP)
        stopped_at = time.time()
        while not (late := dog.overdue(pids)):
            assert time.time() - stopped_at < 30, "the stopped rank was never found late"
            time.sleep(0.2)
        assert late == [1] and dog.late_stopped == {1}  # long before rank 0's 60 s floor
        hang = dog.first_view(pids, time.time())
        assert (hang.rank, hang.frozen, hang.budget_s) == (1, True, 1.0)
        os.kill(pids[1], signal.SIGCONT)  # running again: its frozen time starts over
        time.sleep(0.3)
        assert dog.overdue(pids) == [] and dog.stopped_since == {}
    finally:
        for child in ranks.values():
            child.kill()
            child.wait()
        dog.close()


SPINNER = RANK.replace("train_forever()\n", "while True:\n    pass\n")  # a first step that computes, never ends


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while stacks.process_state(pid) != "T":  # a runnable process waiting for a CPU takes the stop when it runs
        assert time.monotonic() < deadline, "never stopped"
        time.sleep(0.01)


def test_a_rank_stopped_at_every_poll_but_running_between_them_is_no_hang(tmp_path: Path) -> None:
    """A CPU limiter's duty cycle (stopped ~0.05 s of every ~0.25 s), every poll made in a stop, in one long step: its
    CPU time grows between the polls, so its stopped time starts over at each (the step budgets are far off);
    stopped for good, it is hung after the stopped budget."""
    limits = Budgets(watchdog=WatchdogSpec(startup_s=60, restore_s=60, first_step_s=60, step_floor_s=60,
                                           step_factor=3, save_s=60, upload_s=60, stopped_s=1), step_cap_s=100)
    dog = watchdog.Watchdog(limits, [0], tmp_path, 0, learns=False, say=lambda _: None)
    rank = _start_rank(dog, 0, SPINNER)
    try:
        dog.arm()
        start = time.time()
        while time.time() - start < 2.5:
            _stop(rank.pid)
            time.sleep(0.05)
            assert dog.overdue({0: rank.pid}) == []
            os.kill(rank.pid, signal.SIGCONT)
            time.sleep(0.2)
        _stop(rank.pid)
        stopped_at = time.time()
        while not dog.overdue({0: rank.pid}):
            assert time.time() - stopped_at < 10, "the stopped rank was never found late"
            time.sleep(0.1)
        assert time.time() - stopped_at >= 1.0 and dog.late_stopped == {0}
    finally:
        rank.kill()
        rank.wait()
        dog.close()


def test_the_working_time_counts_only_steps(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.progress"
    rank_progress.create(path, 0.0)
    writer = rank_progress.ProgressWriter(str(path))
    writer.enter(Phase.STEP, 1)
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    writer.step_done(1)
    time.sleep(0.2)  # waiting for peers: no work
    writer.step_done(2)
    record = rank_progress.read(path)
    # the busy step's CPU time, and its wait for a CPU on a loaded machine; none of the sleeping step's
    assert record.steps_done == 2 and 0.19 < record.work_s <= record.slowest_step_s + 0.05 and record.wall_s >= 0.4


def test_a_throttled_rank_is_never_hung_and_the_node_reports_its_timing(tmp_path: Path) -> None:
    """A rank at 60 % of its CPU steps 1/0.6 as long: the learned budget grows with it (3 x the slowest step). A
    duty-cycled one (stopped 0.3 s of every 0.8 s) is never seen stopped at every poll for the stopped budget."""
    limits = Budgets(watchdog=WatchdogSpec(startup_s=5, restore_s=5, first_step_s=5, step_floor_s=1, step_factor=3,
                                           save_s=5, upload_s=5, stopped_s=2), step_cap_s=100)
    assert limits.for_progress(Progress(Phase.STEP, 9, 0.0, steps_done=8, slowest_step_s=1 / 0.6), 0.0) == 5.0
    timing = TimingReport(tmp_path, 0, 0, "n1", period_s=0.5)
    dog = watchdog.Watchdog(limits, [0], tmp_path, 0, learns=False, say=lambda _: None, timing=timing)
    rank = _start_rank(dog, 0)
    try:
        dog.arm()
        start = time.time()
        while time.time() - start < 5:
            os.kill(rank.pid, signal.SIGSTOP)
            time.sleep(0.3)
            assert dog.overdue({0: rank.pid}) == []
            os.kill(rank.pid, signal.SIGCONT)
            time.sleep(0.5)
            assert dog.overdue({0: rank.pid}) == []
    finally:
        rank.kill()
        rank.wait()
        dog.close()
    [reported] = node_timing.read_all(tmp_path, 0).values()
    assert (reported.node, reported.host) == (0, "n1") and reported.steps > 10 and reported.wall_s > 0


def test_the_faulthandler_fallback_is_registered_on_an_unused_signal() -> None:
    from slurm_titan.signals import STOP_SIGNALS

    assert stacks.DUMP_SIGNAL not in STOP_SIGNALS
    assert stacks.frozen("T") and stacks.frozen("D") and not stacks.frozen("S")
    assert stacks.stopped("T") and not stacks.stopped("t") and not stacks.stopped("D")
    assert stacks.in_collective('  File "/x/torch/distributed/distributed_c10d.py", line 3 in all_reduce')


# ---- attribution -----------------------------------------------------------------------------------------

def _hang(rank: int, since: float, at: float, frozen: bool = False, in_collective: bool | None = False,
          step: int = 12, phase: str = "step") -> dict:
    return {"rank": rank, "step": step, "phase": phase, "since": since, "time": at, "budget_s": 60.0,
            "state": "T" if frozen else "S", "frozen": frozen, "in_collective": in_collective}


def _hang_report(job_dir: Path, node: int, host: str, hang: dict | None, failure: dict | None = None) -> None:
    node_report(job_dir, 0, node, host, ExitCode.HANG if hang else 1, failure)
    path = job_dir / "attempts" / "0" / f"node-{node}.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"hang": hang}))


def test_the_rank_that_stopped_first_is_blamed_across_nodes(tmp_path: Path) -> None:
    _hang_report(tmp_path, 0, "n1", _hang(0, since=100.0, at=161.0, in_collective=True))  # its peer, waiting
    _hang_report(tmp_path, 1, "n2", _hang(1, since=100.2, at=160.9, frozen=True))  # stopped
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure.describe() == "hung on n2 rank 1 at step 12 (step)"
    _hang_report(tmp_path, 1, "n2", _hang(1, since=100.2, at=160.9, in_collective=False))  # blocked on a read
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert (failure.host, failure.kind) == ("n2", attribution.HUNG)
    _hang_report(tmp_path, 1, "n2", _hang(1, since=100.2, at=160.9, in_collective=True))  # both wait: the oldest
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure.host == "n1"


def test_the_stuck_rank_is_named_with_a_node_clock_5_s_off(tmp_path: Path) -> None:
    """Rank 0 hung in the save of step 12 (at 100.0); rank 1 saved, went on to step 13 at 103.0 and waits
    there. No stacks tell them apart (in_collective None); n2's clock is 5 s behind, n1's 5 s ahead: the steps
    and phases decide, not the clocks."""
    for skew_n1, skew_n2 in ((0.0, -5.0), (5.0, 0.0)):
        _hang_report(tmp_path, 0, "n1", _hang(0, since=100.0 + skew_n1, at=161.0 + skew_n1, in_collective=None,
                                               phase="checkpoint save"))
        _hang_report(tmp_path, 1, "n2", _hang(1, since=103.0 + skew_n2, at=164.0 + skew_n2, in_collective=None,
                                               step=13))
        failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
        assert failure.describe() == "hung on n1 rank 0 at step 12 (checkpoint save)", (skew_n1, skew_n2)
    # rank 1 never finished step 12 (stuck after its last collective) while rank 0 went on to save it: n2 is
    # behind, though its clock, 5 s ahead, says it progressed last
    _hang_report(tmp_path, 1, "n2", _hang(1, since=108.0, at=169.0, in_collective=None))
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure.describe() == "hung on n2 rank 1 at step 12 (step)"


def _sighted_report(job_dir: Path, node: int, skew: float, written: float, hang: dict | None = None,
                    crash: dict | None = None) -> float:
    """Node `node`'s report first written at true time `written` by a node whose clock is `skew` off (its times
    `hang` and `crash`, true, are stamped with its clock too); the batch shell's sighting of it (true, 50 ms late)."""
    stamped = hang and hang | {"since": hang["since"] + skew, "time": hang["time"] + skew}
    _hang_report(job_dir, node, f"n{node + 1}", stamped, crash and crash | {"time": crash["time"] + skew})
    path = job_dir / "attempts" / "0" / f"node-{node}.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"first_written": written + skew}))
    return written + 0.05


def test_a_tie_in_steps_and_phases_is_ordered_on_the_batch_shells_clock(tmp_path: Path) -> None:
    """No stacks; both ranks in step 12's step phase: rank 0 stopped at 100.0, rank 1 waits on it from 101.0. Each
    node's watchdog fires 60 s after its own culprit's stall. With n1's clock 5 s ahead, or n2's 5 s behind, the
    nodes' own clocks name rank 1; on the batch shell's, from its sightings of the reports, rank 0."""
    for skew_n1, skew_n2 in ((5.0, 0.0), (0.0, -5.0)):
        sightings = {0: _sighted_report(tmp_path, 0, skew_n1, 160.0, _hang(0, since=100.0, at=160.0,
                                                                           in_collective=None)),
                     1: _sighted_report(tmp_path, 1, skew_n2, 161.0, _hang(1, since=101.0, at=161.0,
                                                                           in_collective=None))}
        reports = attribution.read_reports(tmp_path, 0, 2)
        assert attribution.first_failure(reports, ["n1", "n2"], set()).rank == 1  # the clocks decided: wrong
        assert attribution.first_failure(reports, ["n1", "n2"], set(), sightings=sightings).rank == 0
        del sightings[1]  # a report the watcher did not see: the nodes' own clocks, as before
        assert attribution.first_failure(reports, ["n1", "n2"], set(), sightings=sightings).rank == 1


def test_a_crash_after_the_hang_is_its_consequence_whatever_the_crashed_nodes_clock(tmp_path: Path) -> None:
    """n1's watchdog fired at 160.0 and its node killed its ranks; n2's rank died of it at 161.5, its report written
    at 162.0 by a clock 5 s behind: by the clocks it crashed first, on the batch shell's it did not."""
    sightings = {0: _sighted_report(tmp_path, 0, 0.0, 160.0, _hang(0, since=100.0, at=160.0)),
                 1: _sighted_report(tmp_path, 1, -5.0, 162.0, crash={"rank": 1, "exit_code": 1, "time": 161.5})}
    reports = attribution.read_reports(tmp_path, 0, 2)
    assert attribution.first_failure(reports, ["n1", "n2"], set()).kind == attribution.CRASHED
    failure = attribution.first_failure(reports, ["n1", "n2"], set(), sightings=sightings)
    assert failure.describe() == "hung on n1 rank 0 at step 12 (step)"


def test_a_crash_before_the_hang_was_seen_is_blamed_after_it_not(tmp_path: Path) -> None:
    _hang_report(tmp_path, 0, "n1", _hang(0, since=100.0, at=161.0, in_collective=True))
    _hang_report(tmp_path, 1, "n2", None, {"rank": 1, "exit_code": -9, "time": 130.0})  # died: n1 waited on it
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure.describe() == "crashed on n2 rank 1 with SIGKILL"
    _hang_report(tmp_path, 1, "n2", None, {"rank": 1, "exit_code": 1, "time": 163.0})  # the kill's consequence
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure.describe() == "hung on n1 rank 0 at step 12 (step)"


@pytest.mark.parametrize("stacks_are", ["quick", "slow", "failing"])
def test_the_supervisors_rank_group_kills_a_hung_node_and_reports_it_first(tmp_path: Path, stacks_are: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_titan.node.supervisor import supervisor
    from slurm_titan.node.supervisor.rendezvous import Rendezvous
    from slurm_titan.node.supervisor.supervisor import RankGroup

    rank_program = RANK.replace('print("ready", flush=True)',
                                'import os, signal\nif os.environ["RANK"] == "3": os.kill(os.getpid(), signal.SIGSTOP)')
    limits = Budgets(watchdog=WatchdogSpec(startup_s=5, restore_s=5, first_step_s=5, step_floor_s=1, step_factor=3,
                                           save_s=5, upload_s=5, stopped_s=100), step_cap_s=100)
    rdzv = Rendezvous("127.0.0.1", 29500, node_rank=1, num_nodes=2, procs_per_node=2, hosts=("a", "b"))
    dog = watchdog.Watchdog(limits, [2, 3], tmp_path, 0, learns=False, say=lambda _: None, node=1, nodes=2)
    group = RankGroup([sys.executable, "-c", rank_program], dict(os.environ, PYTHONPATH=str(REPO)), rdzv,
                      tmp_path, watchdog=dog)
    group.start({})  # arms the watchdog (ungated)
    seen: list[watchdog.Hang] = []
    waited: list[bool] = []
    dog.wait_for_peers = lambda: waited.append(True)  # type: ignore[method-assign]
    slow_stacks = stacks_are == "slow"
    monkeypatch.setattr(supervisor, "FIRST_VIEW_S", 0.05 if slow_stacks else 60.0)
    dump = dog.dumper.dump
    if slow_stacks:  # the stacks take longer than FIRST_VIEW_S: the first view is reported meanwhile
        monkeypatch.setattr(dog.dumper, "dump", lambda *args: time.sleep(1.0) or dump(*args))
    if stacks_are == "failing":  # taking them fails: the first view is reported all the same
        monkeypatch.setattr(dog.dumper, "dump", lambda *args: (_ for _ in ()).throw(OSError("no more processes")))
    try:
        if stacks_are == "failing":
            with pytest.raises(OSError, match="no more processes"):
                group.wait(on_hang=seen.append)
            assert [(view.rank, view.in_collective) for view in seen] == [(3, None)]
            return
        codes = group.wait(on_hang=seen.append)
    finally:
        group.kill()
        dog.close()
    assert codes == {2: -signal.SIGKILL, 3: -signal.SIGKILL}
    assert waited  # stopped in its first step: found by the first step's budget, so it hears the other nodes
    assert [view.rank for view in seen] == [3] * (1 + slow_stacks) and seen[-1] == group.hang  # the last: with stacks
    assert [view.in_collective is None for view in seen] == [True] * slow_stacks + [False]
    assert "==> rank 3 <==" in (tmp_path / "attempts" / "0" / "stacks" / "node-1.txt").read_text()


def test_a_node_waits_for_its_peers_reports_listing_after_a_wait(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dog = watchdog.Watchdog(LIMITS, [0], tmp_path, 0, learns=False, say=lambda _: None, node=0, nodes=3)
    lone = watchdog.Watchdog(LIMITS, [0], tmp_path / "lone", 0, learns=False, say=lambda _: None)
    listings: list[float] = []
    for dog_ in (dog, lone):
        names = dog_.attempt_dir.names
        monkeypatch.setattr(dog_.attempt_dir, "names", lambda names=names: listings.append(time.monotonic()) or names())
    reports = run_folder.attempt_folder(tmp_path, 0)
    for node in range(3):
        (reports / run_folder.node_report_name(node)).write_text("{}")
    try:
        lone.wait_for_peers()
        assert listings == []  # one node: no peers to wait for
        started = time.monotonic()
        dog.wait_for_peers(poll_s=0.2)
        assert len(listings) == 1 and listings[0] - started >= 0.1  # every report there: one listing, after a wait
        (reports / run_folder.node_report_name(2)).unlink()
        started = time.monotonic()
        dog.wait_for_peers(timeout_s=1.0, poll_s=0.2)
        assert time.monotonic() - started >= 1.0 and len(listings) > 2  # node 2 never reported: waited it out
    finally:
        dog.close()
        lone.close()


def test_stacks_that_cannot_be_written_are_said_and_still_returned(tmp_path: Path) -> None:
    (tmp_path / "attempt").mkdir()
    (tmp_path / "attempt" / run_folder.STACKS).write_text("")  # a file where the folder goes
    dumper = stacks.StackDumper({})
    with HeldFolder(tmp_path / "attempt") as folder:
        assert dumper.dump({}, folder, 0) == {}
    assert "not written: " in dumper.why and "stacks" in dumper.why


def test_logs_stacks_prints_the_newest_attempt_that_has_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from slurm_titan.launch import logs

    for attempt, text in ((0, "old"), (1, "new")):
        with HeldFolder(run_folder.attempt_folder(tmp_path, attempt)) as folder:
            for node in (10, 2):
                stacks.write_stacks(folder, node, {2 * node + 1: f"{text} stack\n", 2 * node: "  its peer\n"})
    (tmp_path / "attempts" / "2").mkdir()  # a later attempt without a hang
    assert [path.read_text() for path in logs.newest_stacks(tmp_path)] == [
        "==> rank 4 <==\n  its peer\n==> rank 5 <==\nnew stack\n",
        "==> rank 20 <==\n  its peer\n==> rank 21 <==\nnew stack\n"]
    assert logs.newest_stacks(tmp_path / "elsewhere") == []
    before = run_folder.stacks_folder(tmp_path / "older", 0)  # a run from before: a file a rank
    before.mkdir(parents=True)
    for rank in (10, 2):
        (before / f"rank-{rank}.txt").write_text(f"stack of rank {rank}\n")
    assert [path.name for path in logs.newest_stacks(tmp_path / "older")] == ["rank-2.txt", "rank-10.txt"]
