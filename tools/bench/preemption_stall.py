#!/usr/bin/env python3
"""Benchmark: what one preemption costs a run, and where the time goes (issue 5, part 6).

    eval "$(tools/local-cluster env)"
    .venv/bin/python -m tools.bench.preemption_stall --steps 20 --at-step 6 [--remote dir|s3] [--json out.json]

Each repeat submits the same config (configs/debug_cpu.yaml, 2 nodes, no periodic checkpoint)
twice, one job after the other, on the local Slurm cluster:

- reference: uninterrupted;
- preempted: once rank 0 logged step --at-step, ``scancel --signal=USR2 JOB`` (what Slurm sends
  on preemption); the job checkpoints, requeues itself and resumes from that checkpoint.

From the wall-clock stamps of the preempted run's logs (torchtitan ``[titan] <date> <time>,ms``,
the supervisor/finish ``[slurm-titan HOST HH:MM:SS.mmm]``, submitit's ``(<date> <time>,ms)`` in
``<job>_0_log.out``, and the epoch times of ``history.jsonl``) it splits

- signal -> exit: delivery (scancel -> node 0's supervisor), reaction (rank 0 finishes the step
  and all ranks agree: "stop requested"), save (DCP to node-local disk), upload + commit,
  exit (ranks exit, srun returns, the batch-side decision "attempt 0 ended");
- exit -> first training step of attempt 1: Slurm's wait (requeue, pending, batch script,
  submitit, up to the supervisor's "attempt 1:" line), then torchtitan's start-up (imports, init,
  DCP load, the first step) with the node's restore (the newest complete checkpoint downloaded
  to local disk: "resuming complete checkpoint") running meanwhile;

and reports wall time (submit -> the last attempt's end) preempted / reference, also without
the wait for nodes before the first start (another job on the cluster moves that, not the
preemption). The 1-min load average (sampled while each job runs) and other jobs in the queue are
recorded with each run: on 2 shared cores other work moves every figure.

Everything goes to a private SLURM_TITAN_HOME, runs folder and remote under a temporary folder,
removed at the end with the jobs' node-local checkpoint folders (unless --keep).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from slurm_titan.records import history
from tools.bench.bench_jobs import (
    STEP,
    Bench,
    Run,
    bench_parser,
    first_after,
    median_spread,
    read_lines,
    rounded,
    run_repeats,
)

# (label, from milestone, to milestone, indent): the rows of the table, in order
PHASES: list[tuple[str, str, str, int]] = [
    ("signal -> exit", "signal", "ended", 0),
    ("delivery (scancel -> supervisor)", "signal", "delivered", 1),
    ("reaction (rest of step + agree)", "delivered", "stop", 1),
    ("save (DCP, local disk)", "stop", "saved", 1),
    ("upload + commit", "saved", "committed", 1),
    ("exit (ranks, srun, decision)", "committed", "ended", 1),
    ("ranks exit (-> 'node done')", "committed", "node_done", 2),
    ("srun returns + batch decision", "node_done", "ended", 2),
    ("exit -> first step of attempt 1", "ended", "first_step", 0),
    ("Slurm's wait (-> 'attempt 1:')", "ended", "supervisor", 1),
    ("requeue + pending + batch", "ended", "submitit", 2),
    ("submitit + supervisor start", "submitit", "supervisor", 2),
    ("restore (download, verify)", "supervisor", "resuming", 1),
    ("torchtitan start-up (restore overlaps)", "supervisor", "first_step", 1),
    ("imports (-> first [titan] line)", "supervisor", "titan_up", 2),
    ("init (-> 'Loading the checkpoint')", "titan_up", "load", 2),
    ("DCP load", "load", "loaded", 2),
    ("first step (-> its log line)", "loaded", "first_step", 2),
    ("signal -> first step of attempt 1", "signal", "first_step", 0),
]


def milestones(run: Run) -> dict[str, float | None]:
    """The preempted run's milestones (epoch seconds), each searched after the one before."""
    rank0 = read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted)
    node0 = read_lines(run.job_dir / f"{run.job}_0_log.out", run.submitted)
    a0, a1 = (run.attempts + [history.Attempt(0), history.Attempt(1)])[:2]
    m: dict[str, float | None] = {"signal": run.signalled}
    m["delivered"] = first_after(node0, r"^got SIG", run.signalled and run.signalled - 0.01)
    m["stop"] = first_after(rank0, r"slurm-titan: stop requested", m["delivered"])
    m["saved"] = first_after(rank0, r"Finished saving the checkpoint", m["stop"])
    m["committed"] = first_after(rank0, r"checkpoint step \d+ committed", m["saved"])
    m["node_done"] = first_after(node0, r"^node done", m["committed"])
    m["ended"] = a0.ended
    m["submitit"] = first_after(node0, r"^Starting with JobEnvironment", a0.ended)
    m["supervisor"] = a1.started
    m["resuming"] = first_after(node0, r"^resuming complete checkpoint", a1.started and a1.started - 0.01)
    m["titan_up"] = first_after(rank0, r"", m["supervisor"])
    m["load"] = first_after(rank0, r"^Loading the checkpoint", m["titan_up"])
    m["loaded"] = first_after(rank0, r"^Finished loading the checkpoint", m["load"])
    m["first_step"] = a1.first_step_time
    return m


def phases(m: dict[str, float | None]) -> dict[str, float | None]:
    return {label: rounded(m[b] - m[a] if m[a] is not None and m[b] is not None else None, 2)  # type: ignore[operator]
            for label, a, b, _ in PHASES}


def reference_figures(run: Run) -> dict[str, float | None]:
    """Start-up (supervisor -> first step) and the mean step time of the uninterrupted run."""
    rank0 = read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted)
    steps = [ln.t for ln in rank0 if STEP.match(ln.text)]
    a0 = run.attempts[0] if run.attempts else history.Attempt(0)
    startup = a0.first_step_time - a0.started if a0.first_step_time and a0.started else None
    step_s = (steps[-1] - steps[1]) / (len(steps) - 2) if len(steps) > 2 else None
    return {"startup_s": rounded(startup, 2), "step_s": rounded(step_s, 2)}


def preempted(bench: Bench, *sets: str) -> Run:
    """Submit; once rank 0 logged step --at-step, send what Slurm sends on preemption; wait for the end."""
    run = bench.submit(*sets)
    log, want = run.job_dir / "logs" / "rank-0.log", bench.args.at_step

    def reached() -> bool:
        return log.exists() and any((m := STEP.match(ln.text)) and int(m.group(1)) >= want
                                    for ln in read_lines(log, run.submitted))

    bench.wait(run, reached)
    run.signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", run.job], env=bench.env, check=True, timeout=60)
    bench.wait(run)
    return run


def one_repeat(bench: Bench, runs: list[Run], _index: int) -> dict[str, Any]:
    sets = ("checkpoint.interval=1000", f"checkpoint.remote={bench.args.remote_base}/{{job_id}}")
    ref = bench.run_to_end(*sets)
    runs.append(ref)
    pre = preempted(bench, *sets)
    runs.append(pre)
    r, p = ref.summary(), pre.summary()
    ratio = {key: rounded(p[key] / r[key], 2) if p[key] and r[key] else None for key in ("wall_s", "running_s")}
    a0 = pre.attempts[0] if pre.attempts else history.Attempt(0)
    a1 = pre.attempts[1] if len(pre.attempts) > 1 else history.Attempt(1)
    return {"reference": r | reference_figures(ref), "preempted": p, "phases_s": phases(milestones(pre)),
            "stopped_at_step": a0.stopped_at_step, "resumed_at_step": a1.first_step,
            "attempt_reasons": [a.reason for a in pre.attempts], "ratio_preempted_over_reference": ratio}


def table(results: list[dict[str, Any]]) -> str:
    med = median_spread
    rows = [f"{'  ' * indent + label:<42}{med([r['phases_s'][label] for r in results])}"
            for label, _, _, indent in PHASES]
    rows.append("")
    for key in ("wall_s", "running_s", "queued_s", "load_1min_mean"):
        rows.append(f"{key + ' reference / preempted':<42}{med([r['reference'][key] for r in results])} /"
                    f"{med([r['preempted'][key] for r in results])}")
    for key in ("startup_s", "step_s"):
        rows.append(f"{'reference ' + key:<42}{med([r['reference'][key] for r in results])}")
    for key in ("wall_s", "running_s"):
        rows.append(f"{'ratio preempted/reference ' + key:<42}"
                    f"{med([r['ratio_preempted_over_reference'][key] for r in results], 2)}")
    return "\n".join(["seconds (median over repeats, min-max)", *rows])


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--at-step", type=int, default=6, help="signal once rank 0 logged this step (default 6)")
    args = ap.parse_args()
    return run_repeats(args, "bench-stall-", {"at_step": args.at_step}, one_repeat, table)


if __name__ == "__main__":
    sys.exit(main())
