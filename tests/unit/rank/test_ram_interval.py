"""The RAM tier's snapshot steps: a fixed interval, or `auto`: one probe at the attempt's 4th step, then the smallest
interval whose snapshots stop training for at most 2% of it (no process group: one rank)."""

from __future__ import annotations

from pathlib import Path

from slurm_titan.envvars import RamEnv
from slurm_titan.rank.ram_snapshot import RamSnapshots


def test_a_fixed_interval_snapshots_its_multiples() -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 5, "r"), 0, 1)
    assert [step for step in range(11, 26) if ram.due(step)] == [15, 20, 25]


def test_auto_probes_the_attempts_fourth_step_then_keeps_snapshots_under_two_percent() -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 0, "r"), 0, 1)
    assert [step for step in range(31, 36) if ram.due(step)] == [34]  # an attempt resumed at step 31
    ram.step_s, ram.last_blocked_s = [0.5, 0.5, 0.6], 0.04  # a snapshot stops training 8% of a 0.5 s step
    assert ram.settle_interval() == 4  # 0.04 / (0.02 x 0.5)
    assert ram.settle_interval() == 0  # settled once
    assert [step for step in range(36, 49) if ram.due(step)] == [36, 40, 44, 48]
