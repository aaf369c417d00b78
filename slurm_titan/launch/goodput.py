"""Goodput of a run and where each attempt's time went, from the run's history (torch-free).

Times are Unix seconds from `history.jsonl` (slurm_titan.records.history) and the registry's submit time.
For attempt i, with `prev_end` the previous attempt's end (the submit time for attempt 0), `end`
its end (its `end` event, else its `stopped` event, else the next attempt's start, else now) and
`last_done` the time its last step was done (its `stopped` event, else the mtime of the
`attempts/<A>/trained-step` file rank 0 replaces after every step, else `end`):

- queue_s:     prev_end -> started: Slurm's queue, or the gap before a restart or requeue;
- startup_s:   started -> first step done (`first-step` event): rendezvous, imports, model build,
               the checkpoint restore (it overlaps the model build) and the first step;
- training_s:  first step done -> last_done: steps first_step+1 .. trained;
- retrained_s: the part of training_s spent on steps an earlier attempt had already trained
               (those after the checkpoint it resumed from), at training_s / (trained - first_step)
               per step, for steps first_step+1 .. min(trained, the earlier attempts' last trained);
               retrained_steps counts first_step .. that step;
- stopping_s:  last_done -> end: the final save and teardown, a crash's detection, or (an attempt
               killed without an end record, or still running) its last step -> the next start / now;
- lost_s = queue_s + startup_s + retrained_s + stopping_s, productive_s = training_s - retrained_s;
  summed over the attempts, lost_s + productive_s = wall_s.

`trained` is the attempt's last trained step: its `end` event's, else its `stopped` step, else its
trained-step file's (an attempt killed before it could record its end).

Goodput = sum of productive_s / wall_s, wall_s = submit -> the last attempt's end when the run is
over (its end event says stop), else -> now. Start-up counts as lost even for attempt 0, so a run
never reaches 100%.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm_titan.records import history, run_folder


@dataclass(frozen=True)
class AttemptTime:
    attempt: int
    queue_s: float
    startup_s: float
    training_s: float
    retrained_s: float
    stopping_s: float
    new_steps: int
    retrained_steps: int

    @property
    def lost_s(self) -> float:
        return self.queue_s + self.startup_s + self.retrained_s + self.stopping_s

    @property
    def productive_s(self) -> float:
        return self.training_s - self.retrained_s

    def as_dict(self) -> dict[str, Any]:
        return {key: round(value, 1) if isinstance(value, float) else value for key, value in asdict(self).items()} \
            | {"lost_s": round(self.lost_s, 1), "productive_s": round(self.productive_s, 1)}


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    attempts: list[AttemptTime]

    @property
    def productive_s(self) -> float:
        return sum(a.productive_s for a in self.attempts)

    @property
    def ratio(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"goodput": None if self.ratio is None else round(self.ratio, 4), "wall_s": round(self.wall_s, 1),
                "productive_s": round(self.productive_s, 1),
                "lost_s": round(sum(a.lost_s for a in self.attempts), 1)}


TrainedFiles = dict[int, tuple[int, float]]
"""attempt -> (step, mtime) of its trained-step file."""


def _trained(attempt: history.Attempt, files: TrainedFiles) -> int | None:
    return (attempt.trained_step or attempt.stopped_at_step or attempt.last_step
            or files.get(attempt.attempt, (None,))[0])


def compute(attempts: list[history.Attempt], submitted: float, now: float,
            files: TrainedFiles | None = None) -> Goodput:
    """The numbers of the module docstring."""
    files = files or {}
    rows, prev_end, best = [], submitted, 0
    for i, attempt in enumerate(attempts):
        following = attempts[i + 1] if i + 1 < len(attempts) else None
        started = attempt.started or prev_end
        end = max(attempt.ended or attempt.stopped_time or (following.started if following else None) or now, started)
        trained, first = _trained(attempt, files), attempt.first_step
        if attempt.first_step_time is None or trained is None or first is None:
            rows.append(AttemptTime(attempt.attempt, started - prev_end, end - started, 0.0, 0.0, 0.0, 0, 0))
        else:
            first_done = min(max(attempt.first_step_time, started), end)
            last_done = attempt.stopped_time or files.get(attempt.attempt, (None, end))[1]
            last_done = min(max(last_done, first_done), end)
            training = last_done - first_done
            per_step = training / (trained - first) if trained > first else 0.0
            rows.append(AttemptTime(attempt.attempt, started - prev_end, first_done - started, training,
                                    per_step * max(0, min(trained, best) - first), end - last_done,
                                    max(0, trained - max(first - 1, best)), max(0, min(trained, best) - first + 1)))
            best = max(best, trained)
        prev_end = end
    last = attempts[-1] if attempts else None
    over = last is not None and last.ended is not None and last.action not in ("restart", "requeue")
    return Goodput(max((prev_end if over else now) - submitted, 0.0), rows)


def trained_files(job_dir: Path, attempts: list[history.Attempt]) -> TrainedFiles:
    files = {}
    for attempt in attempts:
        step = history.read_trained_step(job_dir, attempt.attempt)
        if step is not None:
            files[attempt.attempt] = (step, run_folder.trained_step_file(job_dir, attempt.attempt).stat().st_mtime)
    return files


def measure(job_dir: Path, submitted: float, now: float | None = None) -> Goodput:
    """`compute` on a job folder's history and its attempts' trained-step files."""
    attempts = history.read_attempts(job_dir)
    return compute(attempts, submitted, time.time() if now is None else now, trained_files(job_dir, attempts))


def current_step(job_dir: Path, attempts: list[history.Attempt]) -> int | None:
    """The newest step the run trained (the running attempt's trained-step file included)."""
    files = trained_files(job_dir, attempts)
    steps = [step for a in attempts if (step := _trained(a, files))]
    return max(steps) if steps else None
