"""A rank's RAM snapshots (no process group: one rank): the steps (a fixed interval, or `auto`: one probe at the
attempt's 4th step, then the smallest interval whose snapshots stop training for at most 2% of it); a snapshot
written and sealed in a thread at the background's nice, loaded back with the RNG states."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from slurm_titan.envvars import RamEnv
from slurm_titan.ram import layout, snapshot
from slurm_titan.rank.ram_snapshot import RamSnapshots
from slurm_titan.thread_priority import BACKGROUND_NICE


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


def test_a_snapshot_is_written_and_sealed_at_the_backgrounds_nice_and_loads_back_with_the_rng(tmp_path: Path) -> None:
    ram = RamSnapshots(RamEnv(tmp_path, 5, "run-1"), 0, 1)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    torch.manual_seed(3)
    ram.save({"w": torch.arange(4.0)}, step=5)
    drawn = torch.rand(2)
    ram.wait()
    folder = layout.rank_dir(tmp_path, 5, 0)
    assert snapshot.problem(folder, run="run-1", step=5, rank=0, world_size=1) == ""
    writer = ram.writer.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    assert writer == min(19, own + BACKGROUND_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
    state = {"w": torch.zeros(4)}
    ram.load(state, folder)
    assert torch.equal(state["w"], torch.arange(4.0)) and torch.equal(torch.rand(2), drawn)
