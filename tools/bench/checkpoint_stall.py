#!/usr/bin/env python3
"""Benchmark: what the background upload of checkpoints costs training (issue 4: <= 1.05x).

    eval "$(tools/local-cluster env)"
    .venv/bin/python -m tools.bench.checkpoint_stall --steps 20 --interval 2 [--remote dir|s3] [--repeats 3] \
        [--nodes 1]
    # a cluster node's layout on 2 cores: training on CPU 0; the upload and the store on CPU 1
    .venv/bin/python -m tools.bench.checkpoint_stall --nodes 1 --remote s3 --training-cpus 0 --upload-cpus 1 \
        --store-cpus 1

Each repeat submits configs/debug_cpu.yaml (--nodes, default 2, one rank each) twice, one job
after the other, in alternating order, both saving a checkpoint every --interval steps to node-local disk:

- local only: ``checkpoint.remote=null``: torchtitan's save and nothing else;
- with remote: every checkpoint is also uploaded, in the background, to a folder or to a private
  SeaweedFS (--remote s3), and committed once every shard is there.

From rank 0's log it takes the median time the training loop stops for a save (torchtitan's
"Finished saving the checkpoint in X seconds"; queueing the upload afterwards takes microseconds),
the training time (step 1 -> the last step), the median time of a step that follows a save (the
save is in it, and the upload runs beside it) and of the other steps, and from
the run's history the running time (the first start -> the end, which includes waiting for the
last checkpoint's upload). It reports with-remote / local-only for each (1.00 = the upload costs
nothing). save_step_extra_s is what a step that includes a save takes beyond the save and an
ordinary step of the same job: the upload's cost to the step it runs beside, measured within
one job, so that the speed of this shared machine, which drifts from job to job, cancels. The
1-min load average is recorded with each run: on 2 shared cores other work moves every figure.
With --remote s3 the store runs on the same cores as the training ranks unless --store-cpus
pins it elsewhere (on a cluster it runs elsewhere), so the CPU seconds it used during each run
are reported too (store_cpu_s): that much of any stall is the store's, not the uploader's.
--upload-cpus sets checkpoint.upload_cpus (the uploader's own CPUs) and --training-cpus
pins every other thread of the jobs: with --nodes 1 on 2 cores, training on CPU 0 and the
upload (and store) on CPU 1 is a cluster node's layout, where training runs on the
accelerators and leaves host cores free for the upload.
"""

from __future__ import annotations

import re
import statistics
import sys
from typing import Any

from tools.bench.bench_jobs import (
    Bench,
    Run,
    bench_parser,
    median_spread,
    read_lines,
    rounded,
    run_repeats,
    step_times,
)

VARIANTS = ("local only", "with remote")
FIGURES = ("save_s", "train_s", "step_after_save_s", "other_step_s", "running_s")
SAVED = re.compile(r"Finished saving the checkpoint in ([0-9.]+) seconds")


def figures(run: Run, interval: int) -> dict[str, Any]:
    lines = read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted)
    t = step_times(lines)
    saves = [float(m.group(1)) for line in lines if (m := SAVED.search(line.text))]
    last = max(t, default=0)
    gaps = {s: t[s + 1] - t[s] for s in t if s + 1 in t and s >= 2}  # step 1 -> 2 carries warm-up
    after_save = [gap for s, gap in gaps.items() if s % interval == 0]
    other = [gap for s, gap in gaps.items() if s % interval != 0]
    extra = (statistics.median(after_save) - statistics.median(saves) - statistics.median(other)
             if after_save and saves and other else None)
    return run.summary() | {
        "save_s": rounded(statistics.median(saves) if saves else None, 3),
        "save_step_extra_s": rounded(extra, 3),
        "train_s": rounded(t[last] - t[1] if 1 in t else None, 2),
        "step_after_save_s": rounded(statistics.median(after_save) if after_save else None, 3),
        "other_step_s": rounded(statistics.median(other) if other else None, 3),
        "steps_logged": len(t)}


def one_repeat(bench: Bench, runs: list[Run], index: int) -> dict[str, Any]:
    interval = bench.args.interval
    sets = {"local only": ("checkpoint.remote=null",),
            "with remote": (f"checkpoint.remote={bench.args.remote_base}/{{job_id}}",)}
    result: dict[str, Any] = {}
    for variant in VARIANTS if index % 2 == 0 else VARIANTS[::-1]:
        cpu_before = bench.store_cpu_s()
        run = bench.run_to_end(f"checkpoint.interval={interval}", *sets[variant])
        runs.append(run)
        cpu_after = bench.store_cpu_s()
        result[variant] = figures(run, interval) | {
            "store_cpu_s": rounded(cpu_after - cpu_before, 2) if cpu_before is not None else None}
    local, remote = result["local only"], result["with remote"]
    result["ratio"] = {key: rounded(remote[key] / local[key], 3) if remote[key] and local[key] else None
                       for key in FIGURES}
    return result


def table(results: list[dict[str, Any]]) -> str:
    rows = [f"{'':<20}{'local only':>27}{'with remote':>27}{'with / local':>27}"]
    for key in (*FIGURES, "save_step_extra_s", "load_1min_mean", "store_cpu_s"):
        cells = [median_spread([r[v][key] for r in results], 3) for v in VARIANTS]
        ratio = median_spread([r["ratio"][key] for r in results], 3) if key in FIGURES else ""
        rows.append(f"{key:<20}{cells[0]:>27}{cells[1]:>27}{ratio:>27}")
    states = sorted({r[v]["state"] for r in results for v in VARIANTS})
    return "\n".join(["seconds (median over repeats, min-max); job states: " + ", ".join(states), *rows])


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--interval", type=int, default=2, help="checkpoint every N steps (default 2)")
    args = ap.parse_args()
    return run_repeats(args, "bench-upload-stall-", {"interval": args.interval}, one_repeat, table)


if __name__ == "__main__":
    sys.exit(main())
