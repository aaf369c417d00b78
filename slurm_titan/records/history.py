"""A run's own record of its attempts (JSON lines in the job folder), readable without Slurm.

Node 0 appends one `start` and one `end` event per attempt (the batch shell a `slow` one per node it names
slow); `slurm-titan status` reads them, so
the outcome is known even on clusters without accounting (slurmdbd) or after Slurm forgot the job.
Beside it, each attempt's trained-step file: the last step it trained, which rank 0 replaces after
every step (an attempt killed before its `end` event still tells its progress).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurm_titan.records.run_folder import history_file, trained_step_file
from slurm_titan.records.whole_file import replace_text


@dataclass
class Attempt:
    """One attempt of the job: one srun step, numbered from 0 across restarts in the allocation and requeues."""

    attempt: int
    hosts: list[str] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    first_step: int | None = None
    first_step_time: float | None = None
    stopped_at_step: int | None = None
    stopped_time: float | None = None
    stop_signal: str | None = None
    last_step: int | None = None  # the run's final step, trained in this attempt
    trained_step: int | None = None  # the last step this attempt trained
    progressed: bool | None = None  # it trained a step beyond every earlier attempt's
    action: str | None = None  # what followed: stop | requeue | restart
    cause: str | None = None  # a failure's attribution: "crashed on n2 rank 1 with SIGKILL", "node n2 lost"
    culprit: str | None = None  # the node that failure is blamed on
    note: str | None = None  # why the decision went that way ("max_failures=20 reached", ...)
    excluded: list[str] = field(default_factory=list)  # nodes left out after this attempt
    slow: list[dict[str, Any]] = field(default_factory=list)  # nodes named slow: host, score, step, action, why
    extra: dict[str, Any] = field(default_factory=dict)


def append_event(job_dir: Path, event: str, attempt: int, **fields: Any) -> None:
    """Append one event; one `write` of one line, so concurrent readers never see half a record."""
    record = {"event": event, "attempt": attempt, "time": time.time(), **fields}
    with history_file(job_dir).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")


def write_trained_step(job_dir: Path, attempt: int, step: int) -> None:
    """Replace the attempt's trained step at once (tmp + rename: a reader sees the old or the new)."""
    replace_text(trained_step_file(job_dir, attempt), str(step))


def read_trained_step(job_dir: Path, attempt: int) -> int | None:
    """The last step attempt `attempt` trained, None if it trained none."""
    try:
        return int(trained_step_file(job_dir, attempt).read_text())
    except (OSError, ValueError):
        return None


def read_attempts(job_dir: Path) -> list[Attempt]:
    """The attempts recorded so far, oldest first; unreadable lines are skipped."""
    attempts: dict[int, Attempt] = {}
    path = history_file(job_dir)
    if not path.is_file():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        number = int(record.pop("attempt"))
        attempt = attempts.setdefault(number, Attempt(number))
        event, stamp = record.pop("event"), record.pop("time")
        if event == "start":
            attempt.started, attempt.hosts = stamp, record.pop("hosts", [])
        elif event == "end":
            attempt.ended = stamp
            attempt.exit_code, attempt.reason = record.pop("exit_code", None), record.pop("reason", None)
            attempt.trained_step, attempt.progressed = record.pop("trained_step", None), record.pop("progressed", None)
            attempt.action, attempt.cause = record.pop("action", None), record.pop("cause", None)
            attempt.culprit, attempt.note = record.pop("culprit", None), record.pop("note", None) or None
            attempt.excluded = record.pop("excluded", [])
        elif event == "first-step":
            attempt.first_step, attempt.first_step_time = record.pop("step"), stamp
        elif event == "stopped":
            attempt.stopped_at_step, attempt.stop_signal = record.pop("step"), record.pop("signal", None)
            attempt.stopped_time = stamp
        elif event == "action":  # what followed, when it was not what the end record said (finish)
            attempt.action = record.pop("action")
        elif event == "last-step":
            attempt.last_step = record.pop("step")
        elif event == "slow":  # node.batch.slow_watch named a node slow
            attempt.slow.append(record | {"time": stamp})
            continue
        attempt.extra.update(record)
    return [attempts[key] for key in sorted(attempts)]


def stalled_failures(attempts: list[Attempt]) -> int:
    """Failed attempts without progress in a row at the end of `attempts` (the restart-loop count)."""
    count = 0
    for attempt in attempts:
        count = count + 1 if attempt.reason == "failed" and attempt.progressed is False else 0
    return count


def as_dicts(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """Attempts as dicts, each with `time_lost_s`: from its end to the next attempt's first step
    (Slurm's wait, or the restart, then restore and start-up), and `steps_retrained`: the steps it
    trained that the next attempt trained again (those after the checkpoint it resumed from)."""
    rows = [asdict(attempt) for attempt in attempts]
    for row, following in zip(rows, attempts[1:]):
        if row["reason"] is None:  # killed before the batch script could record its end
            row["reason"] = "requeued by Slurm"
        last_alive = row["ended"] or row["stopped_time"]
        if last_alive and following.first_step_time:
            row["time_lost_s"] = round(following.first_step_time - last_alive, 1)
        last_trained = row["trained_step"] or row["stopped_at_step"]
        if last_trained and following.first_step:
            row["steps_retrained"] = max(0, last_trained - following.first_step + 1)
    return rows
