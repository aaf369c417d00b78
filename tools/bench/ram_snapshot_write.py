#!/usr/bin/env python3
"""Benchmark: the CPU a RAM-tier snapshot's write and read cost a rank (issue 25).

    .venv/bin/python -m tools.bench.ram_snapshot_write [--flavor debugmodel] [--repeats 10] [--json out.json]

A rank's snapshot is DCP's save of its whole training state (``no_dist``) into the node's memory folder, in a
background thread of the training process: its CPU is taken from training where the host's cores are busy (2
shared cores here). The state here is torchtitan's llama3 model of --flavor (the debug model by default: 6.2 M
parameters in 45 tensors) with AdamW's moments after one step, in one process, written into /dev/shm. Measured
in one run, alternating, medians of --repeats:

- raw: the project's storage (``slurm_titan.rank.raw_storage``: each tensor's bytes in one file);
- reference: DCP's FileSystemWriter / FileSystemReader (``single_file_per_rank``, no fsync: what snapshots used
  before 2026-12-06): each tensor through ``torch.save`` / ``torch.load``.

CPU time is the process's (user + system); the ratio raw / reference is the figure that travels across machines.
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
import torch.distributed.checkpoint as dcp
from torchtitan.models.llama3 import llama3_configs

from slurm_titan.rank.raw_storage import RawReader, RawWriter

Storage = tuple[Callable[[Path], Any], Callable[[Path], Any]]
STORAGES: dict[str, Storage] = {
    "raw": (RawWriter, RawReader),
    "reference": (lambda path: dcp.FileSystemWriter(str(path), single_file_per_rank=True, sync_files=False),
                  lambda path: dcp.FileSystemReader(str(path))),
}


def training_state(flavor: str) -> dict[str, Any]:
    """The model's and AdamW's state dicts after one step (random gradients), as plain tensors."""
    torch.manual_seed(0)
    model = llama3_configs[flavor]("flex").build()
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


def one(name: str, state: dict[str, Any], root: Path) -> dict[str, float]:
    """Write ``state`` with storage ``name`` into a new folder, read it back into zeros; CPU and wall seconds."""
    writer, reader = STORAGES[name]
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    save_cpu, save_wall = _timed(lambda: dcp.save(state, storage_writer=writer(folder), no_dist=True))
    loaded = _zeroed(state)
    load_cpu, load_wall = _timed(lambda: dcp.load(loaded, storage_reader=reader(folder), no_dist=True))
    if not _equal(loaded, state):
        raise AssertionError(f"{name}: the state read back differs from the state written")
    return {"save_cpu_s": save_cpu, "save_wall_s": save_wall, "load_cpu_s": load_cpu, "load_wall_s": load_wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", default="debugmodel", choices=sorted(llama3_configs))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state = training_state(args.flavor)
    nbytes = sum(t.numel() * t.element_size() for part in state.values() for t in _tensors(part))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in STORAGES}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        for name in STORAGES:  # a first round of each, not counted: imports and allocator warm-up
            one(name, state, Path(tmp))
        for _ in range(args.repeats):
            for name in STORAGES:
                runs[name].append(one(name, state, Path(tmp)))
    medians = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in runs.items()}
    result = {"flavor": args.flavor, "state_bytes": nbytes, "repeats": args.repeats,
              **{name: {key: round(value, 4) for key, value in figures.items()} for name, figures in medians.items()},
              "ratio_raw_over_reference": {key: round(medians["raw"][key] / medians["reference"][key], 3)
                                           for key in medians["raw"]}}
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
