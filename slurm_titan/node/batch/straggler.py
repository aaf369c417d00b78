"""Judge the nodes' speed against each other, and whether swapping a slow one pays (pure, unit-tested).

Each node's timing (records.node_timing) sums its ranks' steps and the CPU time they wanted in them (working,
not waiting for peers: records.schedstat). Between two readings every node finished some steps; its working
time per step over that chunk, set against the median of the other nodes', is its score (1: typical; 0.6:
it works 1/0.6 as long for the same step, and in synchronous training every rank waits for it). A node whose
score over its last `window` steps is below `threshold` is named slow, once per attempt: the window is the
fewest latest chunks that span it, their times summed (so that one noisy chunk weighs what its steps weigh and
a node steadily 1.3x slow, whose chunks straddle 0.8, is named), and its first and last chunks must be below the
threshold too (a dip shorter than the window, or one that is over, is forgiven). Not judged: each
attempt's first `warmup_steps` (start-up, the restore, compilation, the data loader's first batches); saves
and restores are other phases, outside the sums. A slowdown every node shares (the file system, the
network) moves every score alike and names none. On an accelerator each node's chip probe (rank.device_probe:
the same matmul at every step, timed on the device) is a second signal, scored and windowed the same way on
its device time per probe: the host's time cannot see a slow chip, for which the host only waits. A node is
named by whichever signal falls below first; a line's score (one chunk's) is the lower of the two.

Swapping pays when what the slow node costs over the time left, (1 - score) x the time left, exceeds the
swap's measured cost: this run's restart (an earlier restart's end to its next first step, else this
attempt's start-up) and one step (the swap saves at the current step first: nothing is trained again).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from slurm_titan.node.straggler_config import MIN_WINDOW_STEPS, WINDOW_S
from slurm_titan.records import history
from slurm_titan.records.node_timing import NodeTiming
from slurm_titan.records.slow_nodes import ALERT, DEVICE, HOST, SWAP, ScoreLine


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A node the judge names slow."""

    node: int
    host: str
    score: float  # over the window that named it
    step: int
    since_step: int
    step_wall_s: float  # the attempt's wall time per step now (the median node's)
    signal: str = HOST  # what named it: HOST (its ranks' wanted CPU) or DEVICE (its chips' probe)


class Judge:
    """One attempt's judge over `hosts` (node rank order)."""

    def __init__(self, *, attempt: int, hosts: list[str], threshold: float, window_steps: int | None,
                 warmup_steps: int, window_s: float = WINDOW_S) -> None:
        self.attempt, self.hosts, self.threshold, self.warmup_steps = attempt, hosts, threshold, warmup_steps
        self.window, self.window_s = window_steps, window_s
        self._base: dict[int, NodeTiming] = {}  # each node's reading at the last judgment
        self._first_step: int | None = None
        # signal -> node -> its latest chunks, the fewest that span the window: (first step, the others' time,
        # its own time), the times summed over the chunk's steps
        self._chunks: dict[str, dict[int, deque[Chunk]]] = {}
        self.named: set[int] = set()

    def offer(self, timings: dict[int, NodeTiming], now: float) -> tuple[ScoreLine | None, Candidate | None]:
        """The nodes' latest readings: a judgment once every node finished a step since the last one (None
        before), and the node it names slow (None when none)."""
        if len(self.hosts) < 2 or any(node not in timings for node in range(len(self.hosts))):
            return None, None
        current = {node: timings[node] for node in range(len(self.hosts))}
        if self._first_step is None:
            self._first_step = min(t.step for t in current.values())
        base = self._base
        if (not base or any(current[n].steps < base[n].steps for n in current)
                or min(t.step for t in base.values()) < self._first_step + self.warmup_steps):
            self._base = current  # the first reading, new counters (a restarted rank), or still warming up
            return None, None
        steps = {n: current[n].steps - base[n].steps for n in current}
        if min(steps.values()) <= 0:
            return None, None
        signals = {HOST: {n: (current[n].work_s - base[n].work_s) / steps[n] for n in current}}
        probes = {n: current[n].probes - base[n].probes for n in current}
        if min(probes.values()) > 0:  # every node's chip probe finished some probes: its own signal
            signals[DEVICE] = {n: (current[n].device_s - base[n].device_s) / probes[n] for n in current}
        wall = statistics.median((current[n].wall_s - base[n].wall_s) / steps[n] for n in current)
        chunk_start, step = min(t.step for t in base.values()), min(t.step for t in current.values())
        self._base = current
        if self.window is None:
            self.window = max(MIN_WINDOW_STEPS, math.ceil(self.window_s / wall)) if wall > 0 else MIN_WINDOW_STEPS
        line_scores: dict[int, float] = {}
        due = []
        for signal, per_step in signals.items():
            for n, (score, reference) in _against_the_others(per_step).items():
                line_scores[n] = min(score, line_scores.get(n, score))
                chunks = self._chunks.setdefault(signal, {}).setdefault(n, deque())
                chunks.append(Chunk(chunk_start, reference * steps[n], per_step[n] * steps[n]))
                while len(chunks) > 1 and step - chunks[1].since >= self.window:
                    chunks.popleft()
                window_score = _score(sum(c.others_s for c in chunks), sum(c.own_s for c in chunks))
                if (n not in self.named and step - chunks[0].since >= self.window
                        and max(score, chunks[0].score, window_score) < self.threshold):
                    due.append((window_score, n, chunks[0].since, signal))
        line = ScoreLine(self.attempt, now, step, {self.hosts[n]: score for n, score in line_scores.items()})
        if not due:
            return line, None
        score, node, since, signal = min(due)
        self.named.add(node)
        return line, Candidate(node=node, host=self.hosts[node], score=score, step=step, since_step=since,
                               step_wall_s=wall, signal=signal)


@dataclass(frozen=True)
class Chunk:
    """One node's times between two judgments: the others' (their median per step x its steps) and its own."""

    since: int  # the chunk's first step
    others_s: float
    own_s: float

    @property
    def score(self) -> float:
        return _score(self.others_s, self.own_s)


def _score(reference: float, own: float) -> float:
    """The others' time over a node's own; 1.0 for a node that spent no time."""
    return reference / own if own > 0 else 1.0


def _against_the_others(per_step: dict[int, float]) -> dict[int, tuple[float, float]]:
    """Each node's (score, reference): the median of the other nodes' time per step (the reference) over its
    own."""
    against = {}
    for n, own in per_step.items():
        reference = statistics.median(per_step[m] for m in per_step if m != n)
        against[n] = (_score(reference, own), reference)
    return against


def swap_cost_s(attempts: list[history.Attempt], current: int, step_wall_s: float) -> float | None:
    """A swap's cost, as this run measured it: the longest restart of an earlier attempt (its end to the next
    attempt's first step), else the current attempt's start-up (its start to its first step), plus one step;
    None when neither is known yet."""
    rows = history.as_dicts(attempts)
    restarts = [row["time_lost_s"] for row in rows if row["attempt"] < current and "time_lost_s" in row]
    this = next((a for a in attempts if a.attempt == current), None)
    startup = (this.first_step_time - this.started) if this and this.first_step_time and this.started else None
    restart = max(restarts) if restarts else startup
    return None if restart is None else restart + step_wall_s


def choose_action(*, action: str, spare: bool, score: float, step_wall_s: float, steps_left: int | None,
                  time_left_s: float | None, cost_s: float | None) -> tuple[str, str]:
    """SWAP or ALERT for a node named slow at `score`, with why. The time left is the smaller of the steps left
    at the current pace and the allocation's time (either may be unknown)."""
    if action != SWAP:
        return ALERT, f"straggler.action is {action}"
    if not spare:
        return ALERT, "no spare node left in the allocation"
    known = [t for t in (steps_left * step_wall_s if steps_left is not None else None, time_left_s) if t is not None]
    if not known:
        return SWAP, "the time left is unknown"
    left = max(0.0, min(known))
    gain = left * (1 - score)
    if cost_s is None:
        return ALERT, "the swap's cost is not measured yet"
    if gain <= cost_s:
        return ALERT, f"a swap would gain {gain:.0f} s over the {left:.0f} s left, less than its cost ({cost_s:.0f} s)"
    return SWAP, f"a swap gains {gain:.0f} s over the {left:.0f} s left, more than its cost ({cost_s:.0f} s)"
