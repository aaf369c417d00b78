"""`slurm-titan logs --follow`: node events and rank 0's training progress, as they come."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_titan.launch import logs
from slurm_titan.records import jobs

# torchtitan's MetricsProcessor.log lines as a rank log records them (colours included)
STEP = ("[rank0]:[titan] 2025-01-01 10:00:0{n},000 - root - INFO - \x1b[31mstep: {n:2}  \x1b[32mloss: {loss:8.5f}  "
        "\x1b[33mgrad_norm:  1.2345  \x1b[36mmemory:  1.20GiB(3.00%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 0.01  "
        "\x1b[35mmfu: 0.00%\x1b[39m\n")
NOISE = "[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - Building llama3 debugmodel\n"


def _job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    job_dir = tmp_path / "runs" / "demo" / "42"
    (job_dir / "logs").mkdir(parents=True)
    jobs.save(jobs.new_record("42", "demo", job_dir, "job.yaml", 1))
    return job_dir


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(text)


def test_follower_shows_node_events_and_rank0_step_lines_as_they_come(tmp_path, monkeypatch):
    job_dir = _job(tmp_path, monkeypatch)
    node_log, rank0 = job_dir / "42_0_log.out", job_dir / "logs" / "rank-0.log"
    node_log.write_text("attempt 0: starting 2 rank(s) on n1\n")
    follower = logs.Follower(job_dir, "42", rank=None, progress_rank=0)
    assert follower.poll() == "attempt 0: starting 2 rank(s) on n1\n"  # no rank log yet
    _append(rank0, NOISE + STEP.format(n=1, loss=12.0) + STEP.format(n=2, loss=11.5)[:40])  # step 2 half written
    _append(job_dir / "logs" / "rank-1.log", STEP.format(n=1, loss=12.0))
    assert follower.poll() == ("[rank 0] [rank0]:[titan] 2025-01-01 10:00:01,000 - root - INFO - step:  1  "
                               "loss: 12.00000  grad_norm:  1.2345  memory:  1.20GiB(3.00%)  tps: 1,234  "
                               "tflops: 0.01  mfu: 0.00%\n")
    _append(rank0, STEP.format(n=2, loss=11.5)[40:])
    _append(node_log, "attempt 0: checkpoint step 2 committed\n")
    out = follower.poll()
    assert out == "attempt 0: checkpoint step 2 committed\n" + out.splitlines(keepends=True)[-1]
    assert "step:  2  loss: 11.50000" in out and "tps: 1,234" in out and "\x1b" not in out
    assert follower.poll() == ""


def test_follow_prints_progress_until_the_job_ends(tmp_path, monkeypatch, capsys):
    job_dir = _job(tmp_path, monkeypatch)
    rank0 = job_dir / "logs" / "rank-0.log"
    (job_dir / "42_0_log.out").write_text("attempt 0: started\n")
    polls = iter([False, False, True])

    def finished(job_id: str) -> bool:  # a step is logged before each poll but the last
        done = next(polls)
        if not done:
            _append(rank0, STEP.format(n=1, loss=10.0))
        return done

    monkeypatch.setattr(logs, "_finished", finished)
    monkeypatch.setattr(logs, "FOLLOW_POLL_S", 0.0)
    assert logs.show("42", follow=True) == 0
    out = capsys.readouterr().out
    assert out.startswith("attempt 0: started\n")
    assert out.count("[rank 0] ") == 2 and "loss: 10.00000" in out
    assert next(polls, None) is None  # three polls, then it stopped


def test_rank_picks_that_rank_whole_log(tmp_path, monkeypatch, capsys):
    job_dir = _job(tmp_path, monkeypatch)
    (job_dir / "logs" / "rank-1.log").write_text(NOISE + STEP.format(n=1, loss=9.0))
    monkeypatch.setattr(logs, "_finished", lambda job_id: True)
    assert logs.show("42", rank=1, follow=True) == 0
    assert capsys.readouterr().out == NOISE + STEP.format(n=1, loss=9.0)


def test_tail_starts_over_when_a_file_shrinks(tmp_path):
    path = tmp_path / "f.log"
    path.write_text("one\ntwo\n")
    tail = logs.Tail(path)
    assert tail.read() == "one\ntwo\n"
    path.write_text("new\n")
    assert tail.read() == "new\n"
