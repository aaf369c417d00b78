"""The soak's account of where the strict measure's time went (tools.bench.fault_recovery.lost_by_cause), from a
recorded rank log's lines: each interval between consecutive steps classed by what rank 0 logged between them, a
retrained step by its own attempt's lines."""

from __future__ import annotations

from tools.bench.bench_jobs import Line
from tools.bench.fault_recovery import lost_by_cause


def test_each_interval_is_classed_by_what_followed_its_first_step_and_a_restart_is_a_fault() -> None:
    lines = [Line(0.0, "step:  1  loss: 9"), Line(0.05, "slurm-titan: RAM snapshot of step 1: training stopped 0.05 s"),
             Line(1.3, "step:  2  loss: 9"), Line(1.31, "Saving the checkpoint."),
             Line(2.5, "step:  3  loss: 9"), Line(2.51, "Saving the checkpoint."),
             Line(2.52, "slurm-titan: RAM snapshot of step 3: training stopped 0.05 s"),
             Line(4.0, "step:  4  loss: 9"), Line(4.05, "slurm-titan: RAM snapshot of step 4: training stopped 0.05 s"),
             Line(5.0, "step:  5  loss: 9"),
             Line(15.0, "step:  4  loss: 9"),  # the attempt started at 10.0 retrained step 4: no snapshot of it now
             Line(16.0, "step:  5  loss: 9")]
    lost = lost_by_cause(lines, attempt_starts=[10.0], median_s=1.0)
    assert lost == {"snapshot": {"n": 2, "median_s": 1.15, "beyond_s": 0.3},
                    "checkpoint": {"n": 1, "median_s": 1.2, "beyond_s": 0.2},
                    "snapshot and checkpoint": {"n": 1, "median_s": 1.5, "beyond_s": 0.5},
                    "neither": {"n": 1, "median_s": 1.0, "beyond_s": 0.0},
                    "fault": {"n": 1, "median_s": 10.0, "beyond_s": 9.0}}
