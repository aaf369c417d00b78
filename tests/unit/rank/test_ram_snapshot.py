"""A rank's RAM snapshots (no process group: one rank): the steps (a fixed interval, or `auto`: a probe at the
attempt's 4th step, away from store checkpoints, three probes, then the smallest interval whose snapshots cost at
most 2% of training, a snapshot's cost the median of what the 2 steps after each probe took beyond the median); a
snapshot written and sealed in a thread at the background's nice, loaded back with the RNG states."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import pytest
import torch

from slurm_titan.envvars import RamEnv
from slurm_titan.ram import layout, snapshot
from slurm_titan.rank import ram_snapshot
from slurm_titan.rank.ram_snapshot import RamSnapshots
from slurm_titan.thread_priority import BACKGROUND_NICE


def test_a_fixed_interval_snapshots_its_multiples() -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 5, "r"), 0, 1)
    assert [step for step in range(11, 26) if ram.due(step)] == [15, 20, 25]


def test_auto_probes_three_times_from_the_attempts_fourth_step_and_keeps_what_snapshots_cost_under_two_percent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 0, "r"), 0, 1, store_interval=100)
    took = [0.5, 0.5, 0.5, 0.625, 0.5625, 0.5, 0.75, 0.5, 0.5, 0.5, 0.5625]  # 2 steps after each probe: 3 pairs
    clock = iter(list(itertools.accumulate([0.0, *took])) + [6.0 + 0.5 * i for i in range(70)])
    monkeypatch.setattr(ram_snapshot.time, "monotonic", lambda: next(clock))
    probed, settled = [], []
    for step in range(31, 43):  # an attempt resumed at step 31
        probed.append(ram.due(step))
        settled.append(ram.settle_interval())
    assert [step for step, due in zip(range(31, 43), probed, strict=True) if due] == [34, 37, 40]
    assert ram.cost_s == pytest.approx(0.1875)  # the median of 0.1875, 0.25 and 0.0625 beyond the 0.5 s median
    assert settled == [0] * 11 + [19]  # at step 42, once: 0.1875 / (0.02 x 0.5) = 18.75
    assert [step for step in range(43, 100) if ram.due(step)] == [57, 76, 95]


@pytest.mark.parametrize(("took", "stopped", "interval"), [
    ([1.0, 1.0, 1.0, 1.1, 1.0, 0.8, 0.9, 0.8, 0.5, 0.6, 0.55], 0.0, 7),  # a slow start: each probe against its own step
    ([0.5] * 11, 0.05, 5),  # the probes' steps no slower: a snapshot costs at least the time it stops training
])
def test_each_probe_is_measured_against_its_own_step_and_costs_at_least_its_stop(
        monkeypatch: pytest.MonkeyPatch, took: list[float], stopped: float, interval: int) -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 0, "r"), 0, 1)
    clock = iter(list(itertools.accumulate([0.0, *took])) + [20.0 + i for i in range(10)])
    monkeypatch.setattr(ram_snapshot.time, "monotonic", lambda: next(clock))
    for step in range(1, 13):
        if ram.due(step):
            ram.probes_stopped_s.append(stopped)
        settled = ram.settle_interval()
    assert settled == interval


@pytest.mark.parametrize(("store_interval", "resumed_at", "probe"), [(25, 21, 28), (100, 21, 24), (4, 21, 28)])
def test_the_probes_keep_away_from_store_checkpoints_unless_they_come_too_often(store_interval: int,
                                                                                resumed_at: int, probe: int) -> None:
    ram = RamSnapshots(RamEnv(Path("/nonexistent"), 0, "r"), 0, 1, store_interval=store_interval)
    assert next(step for step in range(resumed_at, resumed_at + 12) if ram.due(step)) == probe


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
