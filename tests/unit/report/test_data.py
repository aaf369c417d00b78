"""`report`'s data: step lines, checkpoints, phases and lost time per cause, on recorded run folders
(tests/data/runs, see its README; crash-restart has rank 0's log, written in UTC)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from slurm_titan.records import history, run_folder, slow_nodes
from slurm_titan.report import data, page
from tests.support.recorded import recorded, utc  # noqa: F401  (autouse: the recorded logs are UTC)

SUBMITTED = 1735725600.0  # 2025-01-01 10:00:00 UTC, every recorded run's submit


def report_of(name: str, tmp_path: Path) -> data.RunReport:
    folder, submitted, now = recorded(name, tmp_path)
    return data.collect(folder, submitted, now)


def test_step_lines_and_commits_of_rank_0s_log_by_attempt(tmp_path):
    report = report_of("crash-restart", tmp_path)
    by_attempt = {a: [p.step for p in report.steps if p.attempt == a] for a in (0, 1)}
    assert by_attempt == {0: list(range(1, 38)), 1: list(range(31, 61))}  # steps 31..37 twice
    first, again = report.steps[0], report.steps[37]
    assert (first.step, first.loss, first.tps, first.time) == (1, 10.08239, 620.0, SUBMITTED + 90)
    assert (again.step, again.attempt, again.time) == (31, 1, SUBMITTED + 550)
    assert report.steps[1].tps == 1894.0  # "tps: 1,894"
    assert report.checkpoints == [data.Checkpoint(30, SUBMITTED + 386.3, 0)]


def test_phases_lay_goodputs_times_end_to_end_with_restores_and_saves_cut_out(tmp_path):
    report = report_of("crash-restart", tmp_path)
    phases = [(p.attempt, p.name, round(p.start - SUBMITTED, 1), round(p.end - SUBMITTED, 1)) for p in report.phases]
    assert phases == [
        (0, "queued", 0, 30), (0, "starting", 30, 90), (0, "training", 90, 380.1),
        (0, "saving", 380.1, 382.2), (0, "training", 382.2, 450), (0, "stopped", 450, 460),
        # restarted 10 s after the crash; the restore of step 30 took 25 s of the start-up; steps 31..37 again
        (1, "queued", 460, 470), (1, "starting", 470, 520), (1, "restoring", 520, 545), (1, "starting", 545, 550),
        (1, "retraining", 550, 610), (1, "training", 610, 840),
        (1, "stopped", 840, 840.1), (1, "saving", 840.1, 843), (1, "stopped", 843, 850)]
    # the phases cover the wall time without a gap or an overlap
    assert all(a.end == b.start for a, b in zip(report.phases, report.phases[1:]))
    assert report.phases[-1].end - report.phases[0].start == report.goodput.wall_s


def test_lost_time_by_cause(tmp_path):
    report = report_of("crash-restart", tmp_path)
    assert report.lost_by_cause() == {"queue": 40, "start-up": 115, "restore": 25, "retrained steps": 60,
                                      "hangs": 0, "stopping": 20, "lost (no end record)": 0, "current step": 0}
    assert report.steps_retrained == 7 and report.goodput.ratio == pytest.approx(590 / 850)


@pytest.mark.parametrize("name", ["preempted-requeued", "crash-restart", "node-lost-running"])
def test_the_causes_add_up_to_the_goodputs_lost_time(tmp_path, name):
    report = report_of(name, tmp_path)
    assert sum(report.lost_by_cause().values()) == pytest.approx(report.lost_s)
    assert report.lost_s == pytest.approx(sum(a.lost_s for a in report.goodput.attempts))
    assert report.phases[-1].end - report.phases[0].start == pytest.approx(report.goodput.wall_s)


def test_interruptions_carry_reason_cause_signal_and_what_followed(tmp_path):
    crash, preempted = report_of("crash-restart", tmp_path), report_of("preempted-requeued", tmp_path)
    assert crash.interruptions == [data.Interruption(0, SUBMITTED + 460, 37,
                                                     "attempt 0 failed: crashed on n2 rank 1 with SIGKILL -> restart")]
    assert [(i.label, i.step) for i in preempted.interruptions] == [("attempt 0 preempted on SIGUSR1 -> requeue", None)]


def test_an_attempt_without_end_record_is_lost_and_a_running_one_is_running(tmp_path):
    report = report_of("node-lost-running", tmp_path)
    ends = {p.attempt: (p.name, round(p.seconds, 1)) for p in report.phases if p.name in data.END_PHASES}
    assert ends == {0: ("lost", 60), 1: ("running", 10)}
    causes = report.lost_by_cause()
    assert (causes["lost (no end record)"], causes["current step"]) == (60, 10)
    assert [i.label for i in report.interruptions] == ["attempt 0 requeued by Slurm"]


def test_a_hang_counts_as_hangs(tmp_path):
    t = SUBMITTED + 20
    events = [{"event": "start", "attempt": 0, "time": t, "hosts": ["n1", "n2"]},
              {"event": "first-step", "attempt": 0, "time": t + 60, "step": 1},
              {"event": "end", "attempt": 0, "time": t + 400, "exit_code": 1, "reason": "failed", "trained_step": 21,
               "action": "restart", "cause": "hung on n2 rank 3 in step 22 (collective)", "progressed": True}]
    run_folder.history_file(tmp_path).write_text("".join(json.dumps(e) + "\n" for e in events))
    trained = tmp_path / "attempts" / "0" / "trained-step"
    trained.parent.mkdir(parents=True)
    trained.write_text("21")
    os.utime(trained, (t + 260, t + 260))  # step 21 done 200 s after the first, then nothing for 140 s
    report = data.collect(tmp_path, SUBMITTED, t + 500)
    assert report.lost_by_cause()["hangs"] == 140
    assert report.interruptions[0].label == "attempt 0 failed: hung on n2 rank 3 in step 22 (collective) -> restart"


def test_log_lines_validation_untimed_and_nan(tmp_path):
    log = tmp_path / "rank-0.log"
    log.write_text("[titan] 2025-01-01 10:01:00,250 - root - INFO - \x1b[33mvalidate step: 10  \x1b[32mloss:  3.1\n"
                   "[titan] 2025-01-01 10:01:00,500 - root - INFO - step: 10  loss:     nan  tps: 12  mfu: 1%\n"
                   "[rank0]: step: 11  loss: 2.5\n"
                   "[titan] 2025-01-01 10:02:00,000 - slurm_titan.ckpt.commit - INFO - "
                   "checkpoint step 10 committed: x\n"
                   "[titan] 2025-01-01 10:02:00,000 - root - INFO - Finished loading the checkpoint in 1.50 seconds.\n")
    facts = data.read_log(log, [SUBMITTED, SUBMITTED + 90])
    assert [(p.step, p.tps, p.time, p.attempt) for p in facts.steps] == [(10, 12.0, SUBMITTED + 60.5, 0),
                                                                         (11, None, None, None)]
    assert math.isnan(facts.steps[0].loss)
    assert facts.checkpoints == [data.Checkpoint(10, SUBMITTED + 120, 1)]
    assert facts.busy == [("restoring", SUBMITTED + 118.5, SUBMITTED + 120)]
    assert data.read_log(tmp_path / "missing.log", []) == data.LogFacts([], [], [])


def test_a_run_waiting_for_its_next_attempt_has_it_queued(tmp_path):
    folder, submitted, now = recorded("preempted-requeued", tmp_path)
    attempts = history.read_attempts(folder)
    run_folder.history_file(folder).write_text("".join(line for line in run_folder.history_file(folder).open()
                                                       if '"attempt": 0' in line))  # requeued, not started again
    report = data.collect(folder, submitted, now)
    assert [(p.attempt, p.name, p.end - p.start) for p in report.phases][-1] == (1, "queued", now - attempts[0].ended)
    assert sum(report.lost_by_cause().values()) == pytest.approx(report.lost_s)
    assert report.lost_s == now - submitted - 490
    nothing = data.collect(tmp_path, submitted, submitted + 30)  # submitted, queued in Slurm
    assert [(p.attempt, p.name, p.seconds) for p in nothing.phases] == [(0, "queued", 30)]
    assert nothing.lost_by_cause()["queue"] == 30 and nothing.steps == [] and nothing.interruptions == []


def test_node_scores_and_slow_nodes_come_from_the_attempts(tmp_path):
    folder, submitted, now = recorded("crash-restart", tmp_path)
    slow_nodes.append_scores(folder, 1, slow_nodes.ScoreLine(1, SUBMITTED + 600, 40, {"n1": 1.6, "n2": 0.62}))
    history.append_event(folder, "slow", 1, host="n2", score=0.62, step=40, since_step=32, action="alert", why="x")
    report = data.collect(folder, submitted, now)
    assert report.scores == [slow_nodes.ScoreLine(1, SUBMITTED + 600, 40, {"n1": 1.6, "n2": 0.62})]
    assert report.attempts[1]["slow"][0]["host"] == "n2"
    assert {trace.name for trace in page.score_figure(report).data} == {"n1", "n2", "named slow"}
