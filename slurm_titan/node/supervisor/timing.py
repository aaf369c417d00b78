"""The node's working time per step, for the batch shell's straggler judge (records.node_timing).

The watchdog reads the ranks' progress records every poll anyway; it hands them here, and every `period_s`
the node's sums replace its timing file in the attempt's folder: one small write per node every few seconds,
however long the steps.
"""

from __future__ import annotations

from pathlib import Path

from slurm_titan.records import node_timing
from slurm_titan.records.node_timing import NodeTiming
from slurm_titan.records.rank_progress import Progress

PERIOD_S = 5.0


class TimingReport:
    """Writes node `node`'s timing (its ranks' records summed) at most every `period_s`."""

    def __init__(self, job_dir: Path, attempt: int, node: int, host: str, period_s: float = PERIOD_S) -> None:
        self.job_dir, self.attempt, self.node, self.host, self.period_s = job_dir, attempt, node, host, period_s
        self._written_at: float | None = None

    def offer(self, records: dict[int, Progress], now: float) -> None:
        """The ranks' records of this poll; written when the period is over. A failing write (the shared file
        system) is left for the next period: the judge then sees an older reading."""
        if not records or (self._written_at is not None and now - self._written_at < self.period_s):
            return
        self._written_at = now
        try:
            node_timing.write(self.job_dir, self.attempt, NodeTiming.of(self.node, self.host, records, now))
        except OSError:
            pass
