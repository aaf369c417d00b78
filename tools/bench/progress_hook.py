#!/usr/bin/env python3
"""Benchmark: what the watchdog's progress hook costs a training step (issue 11, part 7).

    .venv/bin/python -m tools.bench.progress_hook [--calls 200000] [--step-ms 100] [--json out.json]

Per step every rank makes one `rank_progress.step_done` call (from the checkpoint hook's `save()`),
plus an `enter` for each save; the supervisor reads the records every 0.5 s. Measured here, in one run:

- hook: `step_done` on a record in /dev/shm (or the temp folder), the way a rank makes it (its schedstat
  reading of the rank's threads included: records.schedstat; tools/bench/straggler.py --cost sets the hook
  against a real debug-model step, with torch's threads);
- reference: an empty Python function call in the same loop (the floor of any hook);
- and the hook's share of a step of `--step-ms` (100 ms: the debug model's CPU step is ~0.3-1 s, an
  8B NPU step several seconds, so 100 ms is on the safe side). Goal: <= 1 %.

The ratio hook / reference is the figure that travels across machines; the absolute microseconds
depend on the CPU and its load (2 shared cores here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from slurm_titan.records import rank_progress
from slurm_titan.records.rank_progress import Phase


def _empty(step: int) -> None:
    pass


def _per_call_s(function, calls: int) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for step in range(calls):
        function(step)
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=root) as folder:
        path = Path(folder) / "rank-0.progress"
        rank_progress.create(path, time.time())
        writer = rank_progress.ProgressWriter(str(path))
        writer.enter(Phase.STEP, 1)
        hook, reference = [], []
        for _ in range(args.repeats):  # interleaved, so that load on the machine hits both alike
            reference.append(_per_call_s(_empty, args.calls))
            hook.append(_per_call_s(writer.step_done, args.calls))
        assert rank_progress.read(path).steps_done == args.calls * args.repeats
    hook_s, reference_s = statistics.median(hook), statistics.median(reference)
    result = {"hook_us": round(hook_s * 1e6, 3), "reference_us": round(reference_s * 1e6, 3),
              "ratio": round(hook_s / reference_s, 1), "step_ms": args.step_ms,
              "share_of_step_pct": round(100 * hook_s / (args.step_ms / 1000), 5),
              "folder": root or tempfile.gettempdir()}
    print(f"progress hook: {result['hook_us']} us per step ({result['ratio']}x an empty call of "
          f"{result['reference_us']} us); {result['share_of_step_pct']} % of a {args.step_ms:g} ms step (goal <= 1 %)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
