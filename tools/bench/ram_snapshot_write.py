#!/usr/bin/env python3
"""Benchmark: the CPU a RAM-tier snapshot costs a rank (issue 25): the copy that stops training, the write in the
background, the read on a recovery.

    .venv/bin/python -m tools.bench.ram_snapshot_write [--flavor debugmodel] [--repeats 10] [--json out.json]

A rank's snapshot is a copy of its whole training state into host memory (training waits for it), then written
into the node's memory folder in a background thread of the training process: its CPU is taken from training where
the host's cores are busy (2 shared cores here). The state here is torchtitan's llama3 model of --flavor (the debug
model by default: 6.2 M parameters in 45 tensors) with AdamW's moments after one step, its tensors DTensors (FSDP2
over a gloo group of this one process), written into /dev/shm, on one thread (``torch.set_num_threads(1)``, as the
debug job's ranks). Measured in one run, alternating, medians of --repeats:

- files: the project's snapshot (``slurm_titan.rank.snapshot_files``: ``Stager.stage``, ``write``, ``load``);
- reference: DCP as a library user saves asynchronously: ``DefaultStager`` (no pinning on the CPU), then
  ``dcp.save`` into ``FileSystemWriter`` (``single_file_per_rank``, no fsync), ``dcp.load`` from
  ``FileSystemReader``.

CPU time is the process's (user + system); the ratio files / reference is the figure that travels across machines.
Each repeat's load is checked equal to the state saved.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.fsdp import fully_shard
from torchtitan.models.llama3 import llama3_configs

from slurm_titan.rank import snapshot_files


class Files:
    """The project's snapshot files."""

    def __init__(self) -> None:
        self.stager = snapshot_files.Stager(accelerator=False)

    def stage(self, state: dict[str, Any]) -> Any:
        return self.stager.stage(state)

    def write(self, staged: Any, folder: Path) -> None:
        snapshot_files.write(staged, folder)

    def load(self, state: dict[str, Any], folder: Path) -> None:
        snapshot_files.load(state, folder)


class Reference:
    """DCP's asynchronous save as a library user writes it, its stager's copy and its writer's write apart."""

    def __init__(self) -> None:
        self.stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                   use_async_staging=False, use_non_blocking_copy=False))

    def stage(self, state: dict[str, Any]) -> Any:
        return self.stager.stage(state)

    def write(self, staged: Any, folder: Path) -> None:
        writer = dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=False)
        dcp.save(staged, storage_writer=writer, no_dist=True)

    def load(self, state: dict[str, Any], folder: Path) -> None:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)


STORAGES: dict[str, Callable[[], Files | Reference]] = {"files": Files, "reference": Reference}


def training_state(flavor: str) -> dict[str, Any]:
    """The model's and AdamW's state dicts after one step (random gradients), every tensor a DTensor as in a rank
    (each layer and the model under FSDP2 over a process group of this one process)."""
    torch.manual_seed(0)
    model = llama3_configs[flavor]("flex").build()
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _zeroed(state: Any) -> Any:
    if isinstance(state, dict):
        return {key: _zeroed(value) for key, value in state.items()}
    return torch.zeros_like(state) if isinstance(state, torch.Tensor) else state


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def _timed(work: Callable[[], None]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.process_time() - cpu, time.perf_counter() - wall


def one(name: str, storage: Files | Reference, state: dict[str, Any], root: Path) -> dict[str, float]:
    """Stage ``state`` with ``storage``, write it into a new folder, read it back into zeros; CPU and wall
    seconds of each."""
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    staged: list[Any] = []
    stage_cpu, stage_wall = _timed(lambda: staged.append(storage.stage(state)))
    write_cpu, write_wall = _timed(lambda: storage.write(staged[0], folder))
    loaded = _zeroed(state)
    load_cpu, load_wall = _timed(lambda: storage.load(loaded, folder))
    if not _equal(loaded, state):
        raise AssertionError(f"{name}: the state read back differs from the state written")
    return {"stage_cpu_s": stage_cpu, "stage_wall_s": stage_wall, "write_cpu_s": write_cpu,
            "write_wall_s": write_wall, "load_cpu_s": load_cpu, "load_wall_s": load_wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", default="debugmodel", choices=sorted(llama3_configs))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    warnings.filterwarnings("ignore", message="DTensor random operators")  # the model's init on a CPU mesh
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}/pg", rank=0, world_size=1)
    state = training_state(args.flavor)
    nbytes = sum(t.numel() * t.element_size() for part in state.values() for t in _tensors(part))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in STORAGES}
    storages = {name: make() for name, make in STORAGES.items()}  # each keeps its buffers, as a rank does
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        for name, storage in storages.items():  # a first round of each, not counted: imports, buffers, allocator
            one(name, storage, state, Path(tmp))
        for _ in range(args.repeats):
            for name, storage in storages.items():
                runs[name].append(one(name, storage, state, Path(tmp)))
    medians = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in runs.items()}
    result = {"flavor": args.flavor, "state_bytes": nbytes, "repeats": args.repeats,
              **{name: {key: round(value, 4) for key, value in figures.items()} for name, figures in medians.items()},
              "ratio_files_over_reference": {key: round(medians["files"][key] / medians["reference"][key], 3)
                                             for key in medians["files"]}}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def _tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, dict):
        return [t for value in state.values() for t in _tensors(value)]
    return [state] if isinstance(state, torch.Tensor) else []


if __name__ == "__main__":
    raise SystemExit(main())
