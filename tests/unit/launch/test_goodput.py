"""Goodput and the time each attempt lost, on recorded run folders (tests/data/runs, see its README)."""

from __future__ import annotations

import pytest

from slurm_titan.launch import goodput
from slurm_titan.records import history
from tests.support.recorded import recorded


def table(result: goodput.Goodput) -> list[tuple[float, ...]]:
    return [tuple(round(v, 1) for v in (a.queue_s, a.startup_s, a.training_s, a.retrained_s, a.stopping_s,
                                        a.new_steps, a.retrained_steps, a.lost_s)) for a in result.attempts]


@pytest.mark.parametrize(("name", "attempts", "wall", "ratio"), [
    # queue startup training retrained stopping new retrained-steps lost
    ("preempted-requeued", [(60, 60, 490, 0, 30, 50, 0, 150), (300, 60, 490, 0, 10, 50, 0, 370)], 1500, 980 / 1500),
    # attempt 1 resumed from step 30 after attempt 0 trained to 37: steps 31..37 again, 6 of them after its
    # first step at 10 s a step
    ("crash-restart", [(30, 60, 360, 0, 10, 37, 0, 100), (10, 80, 290, 60, 10, 23, 7, 160)], 850, 590 / 850),
    # attempt 0 left no end record: its last step is its trained-step file's mtime, then 60 s until the
    # requeued attempt started; attempt 1 is running (now = 1000 s after the submit)
    ("node-lost-running", [(100, 60, 480, 0, 60, 25, 0, 220), (0, 60, 230, 48.4, 10, 15, 5, 118.4)], 1000,
     (480 + 230 - 4 * 230 / 19) / 1000),
])
def test_goodput_of_recorded_runs(tmp_path, name, attempts, wall, ratio):
    folder, submitted, now = recorded(name, tmp_path)
    result = goodput.measure(folder, submitted, now)
    assert table(result) == attempts
    assert result.wall_s == wall and result.ratio == pytest.approx(ratio)
    # every second since the submit is either productive or lost
    assert result.productive_s + sum(a.lost_s for a in result.attempts) == pytest.approx(result.wall_s)


def test_a_finished_run_stops_its_clock_and_a_requeued_one_does_not(tmp_path):
    folder, submitted, now = recorded("preempted-requeued", tmp_path)
    assert goodput.measure(folder, submitted, now + 3600).wall_s == 1500  # finished: ends at its last end
    attempts = history.read_attempts(folder)[:1]  # only attempt 0, which asked for a requeue: still waiting
    assert goodput.compute(attempts, submitted, now).wall_s == now - submitted


def test_an_attempt_that_never_trained_is_all_lost(tmp_path):
    history.append_event(tmp_path, "start", 0, hosts=["n1"])
    start = history.read_attempts(tmp_path)[0].started
    result = goodput.compute(history.read_attempts(tmp_path), start - 5, start + 40)
    assert table(result) == [(5, 40, 0, 0, 0, 0, 0, 45)] and result.ratio == 0
    assert result.as_dict() == {"goodput": 0.0, "wall_s": 45.0, "productive_s": 0.0, "lost_s": 45.0}


def test_current_step_reads_the_running_attempt_file(tmp_path):
    folder, _, _ = recorded("node-lost-running", tmp_path)
    assert goodput.current_step(folder, history.read_attempts(folder)) == 40
