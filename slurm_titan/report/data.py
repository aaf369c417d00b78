"""What `slurm-titan report` draws, read from a job folder alone (no Slurm, no torch, no plotly).

- Step lines of rank 0's log (`<job>/logs/rank-0.log`, appended to by every attempt): torchtitan's
  `MetricsProcessor.log` line `step: N  loss: L  ...  tps: T  ...` (colours stripped; validation's
  `validate step:` lines are not training steps);
- checkpoints: rank 0's uploader logs `checkpoint step N committed` once a checkpoint is committed
  (slurm_titan.ckpt.commit, as slurm_titan.launch.runs reads it);
- restores and saves: torchtitan's checkpointer logs `Finished loading|saving|staging the checkpoint
  in S seconds.` (torchtitan/components/checkpointer/dcp.py) when it is done: the S seconds before;
- each node's score against the others over time (`attempts/<A>/node-scores.jsonl`, records.slow_nodes: the
  batch shell's slow-node judge) and the nodes it named slow (the history's `slow` events);
- each attempt's phases and lost time: slurm_titan.launch.goodput's per-attempt times, laid end to end from
  the submit (queue, start-up, training with its retrained steps first, then its end), with the
  restores cut out of the start-up and the saves out of what follows the first step; a run that
  waits for its next attempt (none yet, or requeued) has that attempt queued until now.

Log lines carry logging's `asctime` (`2025-01-01 10:00:00,123`) in the nodes' local time; they are
read as this machine's local time (Slurm passes the submitting shell's environment, TZ included, to
the job) and each timed line belongs to the attempt that had started by then.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_titan.launch import goodput, run_view
from slurm_titan.records import history, slow_nodes
from slurm_titan.records.run_folder import rank_log
from slurm_titan.records.slow_nodes import ScoreLine

REPORT_RANK = 0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*(\S+)")
_TPS = re.compile(r"\btps:\s*([\d,]+)")
_COMMITTED = re.compile(r"checkpoint step (\d+) committed")
_FINISHED = re.compile(r"Finished (loading|saving|staging) the checkpoint in ([0-9.]+) seconds")


@dataclass(frozen=True)
class StepPoint:
    step: int
    loss: float
    tps: float | None
    time: float | None  # Unix seconds; None: the line has no timestamp
    attempt: int | None


@dataclass(frozen=True)
class Checkpoint:
    step: int
    time: float | None
    attempt: int | None


@dataclass(frozen=True)
class Phase:
    """queued | starting | restoring | retraining | training | saving | stopped | hung | lost | running."""

    attempt: int
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Interruption:
    attempt: int
    time: float  # when the attempt ended
    step: int | None  # its last step in the log
    label: str  # "attempt 0 failed: crashed on n2 rank 1 with SIGKILL -> restart"


@dataclass(frozen=True)
class RunReport:
    """What the page draws of a job, or of a run across its jobs (`job_of`: each attempt's job, numbered across the
    run; empty for a job's report)."""

    source: str  # the job folder, or the run and its location
    submitted: float
    attempts: list[dict[str, Any]]  # history.as_dicts
    goodput: goodput.Goodput
    steps: list[StepPoint]
    checkpoints: list[Checkpoint]
    phases: list[Phase]
    interruptions: list[Interruption]
    scores: list[ScoreLine]  # every node's score over time, every attempt
    job_of: dict[int, str] = field(default_factory=dict)

    @property
    def steps_retrained(self) -> int:
        return sum(a.retrained_steps for a in self.goodput.attempts)

    @property
    def lost_s(self) -> float:
        """Wall time not spent training new steps (the attempts' lost time and the wait for the next one)."""
        return self.goodput.wall_s - self.goodput.productive_s

    def lost_by_cause(self) -> dict[str, float]:
        """`lost_s` by cause: the goodput's per-attempt times, the wait for the next attempt counted as queue."""
        restore = sum(p.seconds for p in self.phases if p.name == "restoring")
        ends = {p.attempt: p.name for p in self.phases if p.name in END_PHASES}
        causes = {"queue": 0.0, "start-up": -restore, "restore": restore, "retrained steps": 0.0, "hangs": 0.0,
                  "stopping": 0.0, "lost (no end record)": 0.0, "current step": 0.0}
        causes["queue"] += sum(p.seconds for p in self.phases if p.attempt >= len(self.goodput.attempts))
        for times in self.goodput.attempts:
            causes["queue"] += times.queue_s
            causes["start-up"] += times.startup_s
            causes["retrained steps"] += times.retrained_s
            causes[_END_CAUSE[ends.get(times.attempt, "stopped")]] += times.stopping_s
        return causes


END_PHASES = ("stopped", "hung", "lost", "running")
_END_CAUSE = {"stopped": "stopping", "hung": "hangs", "lost": "lost (no end record)", "running": "current step"}


def local_time(text: str) -> float:
    """`2025-01-01 10:00:00,123` (logging's asctime, local time) as Unix seconds."""
    stamp = _TIME.search(text)
    if stamp is None:
        raise ValueError(f"no timestamp in {text!r}")
    return time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000


def _lines(path: Path) -> Iterator[tuple[str, float | None]]:
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with handle:
        for raw in handle:
            line = _ANSI.sub("", raw)
            yield line, local_time(line) if _TIME.search(line) else None


@dataclass
class LogFacts:
    steps: list[StepPoint]
    checkpoints: list[Checkpoint]
    busy: list[tuple[str, float, float]]  # ("restoring" | "saving", start, end)


def read_log(path: Path, starts: list[float]) -> LogFacts:
    """One pass over a rank log; `starts` are the attempts' start times (ascending), index = attempt."""
    def attempt_at(stamp: float | None) -> int | None:
        return None if stamp is None or not starts else max(bisect.bisect_right(starts, stamp) - 1, 0)

    facts = LogFacts([], [], [])
    for line, stamp in _lines(path):
        if step := _STEP.search(line):
            try:
                loss = float(step.group(2))
            except ValueError:
                continue
            tps = _TPS.search(line)
            throughput = float(tps.group(1).replace(",", "")) if tps else None
            facts.steps.append(StepPoint(int(step.group(1)), loss, throughput, stamp, attempt_at(stamp)))
        elif committed := _COMMITTED.search(line):
            facts.checkpoints.append(Checkpoint(int(committed.group(1)), stamp, attempt_at(stamp)))
        elif (finished := _FINISHED.search(line)) and stamp is not None:
            kind = "restoring" if finished.group(1) == "loading" else "saving"
            facts.busy.append((kind, stamp - float(finished.group(2)), stamp))
    return facts


def _end_phase(attempt: history.Attempt, last: bool) -> str:
    if (attempt.cause or "").startswith("hung on "):
        return "hung"
    if attempt.ended is None and attempt.stopped_time is None:
        return "running" if last else "lost"
    return "stopped"


def _carve(phases: list[Phase], start: float, end: float, name: str, within: tuple[str, ...]) -> list[Phase]:
    """`phases` with [start, end) renamed `name` where it overlaps a phase named in `within`."""
    out = []
    for phase in phases:
        lo, hi = max(phase.start, start), min(phase.end, end)
        if phase.name not in within or lo >= hi:
            out.append(phase)
            continue
        pieces = [(phase.name, phase.start, lo), (name, lo, hi), (phase.name, hi, phase.end)]
        out += [Phase(phase.attempt, n, s, e) for n, s, e in pieces if e > s]
    return out


def phases(attempts: list[history.Attempt], result: goodput.Goodput, submitted: float,
           busy: list[tuple[str, float, float]]) -> list[Phase]:
    """Every attempt's phases, end to end from the submit (the module docstring)."""
    out: list[Phase] = []
    prev_end = submitted
    for i, (attempt, times) in enumerate(zip(attempts, result.attempts)):
        started = prev_end + times.queue_s
        first_done = started + times.startup_s
        last_done = first_done + times.training_s
        marks = [("queued", prev_end), ("starting", started), ("retraining", first_done),
                 ("training", first_done + times.retrained_s), (_end_phase(attempt, i == len(attempts) - 1), last_done),
                 ("", last_done + times.stopping_s)]
        out += [Phase(attempt.attempt, name, start, end)
                for (name, start), (_, end) in zip(marks, marks[1:]) if end > start]
        prev_end = marks[-1][1]
    if submitted + result.wall_s > prev_end:  # the run waits for its next attempt (queued, or a restart)
        out.append(Phase(len(attempts), "queued", prev_end, submitted + result.wall_s))
    for kind, start, end in busy:
        within = ("starting",) if kind == "restoring" else ("retraining", "training", "stopped", "hung")
        out = _carve(out, start, end, kind, within)
    return out


def interruptions(rows: list[dict[str, Any]], phase_list: list[Phase], steps: list[StepPoint]) -> list[Interruption]:
    """Each attempt's end but a finished run's last one (and a running one): its reason, cause, signal and
    what followed, from the history."""
    ends = {p.attempt: p.end for p in phase_list}
    last_steps = {p.attempt: p.step for p in steps if p.attempt is not None}
    out = []
    for row in rows:
        if row["reason"] in (None, "finished") or row["attempt"] not in ends:
            continue
        label = f"attempt {row['attempt']} {row['reason']}" + (f": {row['cause']}" if row["cause"] else "") \
            + (f" on {row['stop_signal']}" if row["stop_signal"] else "") \
            + (f" -> {row['action']}" if row["action"] else "")
        out.append(Interruption(row["attempt"], ends[row["attempt"]], last_steps.get(row["attempt"]), label))
    return out


def collect(job_dir: Path, submitted: float, now: float | None = None) -> RunReport:
    """Everything the report shows of a job, from its folder and the submit time (registry)."""
    attempts = history.read_attempts(job_dir)
    result = goodput.compute(attempts, submitted, time.time() if now is None else now,
                             goodput.trained_files(job_dir, attempts))
    return _report(str(job_dir), submitted, attempts, result, [(job_dir, attempts)])


def collect_run(view: run_view.RunView) -> RunReport:
    """Everything the report shows of a run across its jobs (launch.run_view): its attempts numbered across the run on
    one step axis and one clock from its first job's submit, the gaps between jobs queued, each job's log and node
    scores read from its folder."""
    by_job = {job.job_id: [a for job_id, a in view.attempts if job_id == job.job_id] for job in view.jobs}
    report = _report(f"run {view.name}: jobs {', '.join(by_job)}", view.submitted, view.numbered, view.goodput,
                     [(job.folder, by_job[job.job_id]) for job in view.jobs])
    return replace(report, job_of={i: job_id for i, (job_id, _) in enumerate(view.attempts)})


def _report(source: str, submitted: float, attempts: list[history.Attempt], result: goodput.Goodput,
            folders: list[tuple[Path, list[history.Attempt]]]) -> RunReport:
    """The report of `attempts` (numbered in order), whose jobs' folders and own attempts `folders` lists in order:
    each folder's log lines and scores belong to its attempts, numbered after the folders before it."""
    facts, scores, offset = LogFacts([], [], []), [], 0
    for folder, own in folders:
        log = read_log(rank_log(folder, REPORT_RANK), [a.started or submitted for a in own])
        facts.steps += [replace(p, attempt=None if p.attempt is None else p.attempt + offset) for p in log.steps]
        facts.checkpoints += [replace(c, attempt=None if c.attempt is None else c.attempt + offset)
                              for c in log.checkpoints]
        facts.busy += log.busy
        scores += [replace(line, attempt=line.attempt + offset) for line in slow_nodes.read_scores(folder)]
        offset += len(own)
    phase_list = phases(attempts, result, submitted, facts.busy)
    rows = history.as_dicts(attempts)
    return RunReport(source, submitted, rows, result, facts.steps, _unique(facts.checkpoints), phase_list,
                     interruptions(rows, phase_list, facts.steps), scores)


def _unique(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """The first commit of each step (a later attempt may log an already-committed one again)."""
    seen: dict[int, Checkpoint] = {}
    for checkpoint in checkpoints:
        seen.setdefault(checkpoint.step, checkpoint)
    return sorted(seen.values(), key=lambda c: c.step)
