"""Unplanned failures on the local cluster: from a real fault to the next trained step, and goodput in a soak.

Each fault kind runs once per repeat on configs/debug_cpu.yaml (2 nodes), injected from outside once rank 1
(the node of rank 1, for node faults) logged step --at-step:

  crash         SIGKILL of rank 1 (default config): recovered inside the allocation
  hang          SIGSTOP of rank 1: found by the watchdog, then recovered inside the allocation
  node-spare    node of rank 1 killed whole (slurmd and every process), slurm.spare_nodes=1 (the
                allocation outlives the node: slurm.keep_allocation_on_node_loss, on by default)
  node-requeue  the same without a spare: the job requeues itself without that node
                (the cluster is brought back whole afterwards: tools/local-cluster up)

Reported per fault: detection (fault -> the node log's first word of it), fault -> next trained step, the
steps trained twice, the attempts and whether Slurm requeued. With --memory-interval N|auto every job runs with
the RAM tier on (checkpoint.memory): besides, what a snapshot costs (the time it stops training over the median
step: `snapshot_blocking_ratio`, from the ranks' logs) and the bytes replicated per snapshot and node (the
supervisors' first copy to the partner). With --standby every job keeps its next attempt's step standing by
(preemption.standby_step). With --soak-minutes M, one job then trains for M minutes while a crash
or a hang (seeded random choice) is injected every --fault-every seconds (+-30%); goodput = distinct steps
trained in the soak x the uninterrupted time per step (the mean interval between consecutive steps of one
attempt in the soak, its checkpoint saves included) / its wall time; `goodput_strict` takes the median interval
instead, so that saves and the spread of step times count as lost as well, and `goodput_save_free` the median of
the intervals after which nothing was saved (with a snapshot every few steps, those after one are a good part of
all, and lift the median: the strict figure then counts part of their cost as training); `lost_by_cause` says where
that time went (rank 0's intervals between consecutive steps by what followed the first: a RAM snapshot, a store
checkpoint, both, neither, a fault). No node of the soak is slow: every node the slow-node judge names in it (the
history's `slow` events) is a false positive (`slow_false_positives`, and per hour: the goal is none in 20 minutes).
References (fault-tolerance-anchors): nvidia-resiliency-ext in-job restart ~1 min; MindCluster detection
< 5 s + restart ~70 s.
"""

from __future__ import annotations

import json
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from slurm_titan.records import history
from tools.bench.bench_jobs import (
    STEP,
    Bench,
    Line,
    Run,
    bench_parser,
    median_spread,
    read_lines,
    rounded,
    run_repeats,
    step_times,
)
from tools.local_cluster.cluster import LocalCluster
from tools.local_cluster.faults import SignalAtStep, step_reached

FAULTS = ("crash", "hang", "node-spare", "node-requeue")
DETECTION = {"crash": "exited with code", "hang": "watchdog: rank", "node-spare": "attempt 0 ended",
             "node-requeue": "attempt 0 ended"}


def node_log_lines(run: Run) -> list[tuple[float, str]]:
    """The batch shell's and supervisors' stamped lines, every node, as (time, text)."""
    lines = []
    for path in run.job_dir.glob(f"{run.job}_*_log.out"):
        lines += [(ln.t, ln.text) for ln in read_lines(path, run.submitted)]
    return sorted(lines)


BLOCKED = re.compile(r"RAM snapshot of step \d+: training stopped ([0-9.]+) s")
REPLICATED = re.compile(r"RAM tier: step \d+ copied to the partner \S+: (\d+) bytes")
AUTO_INTERVAL = re.compile(r"RAM tier: a snapshot every (\d+) step")
SNAPSHOT = re.compile(r"RAM snapshot of step \d+:")
STORE_SAVE = "Saving the checkpoint."


def after_fault(run: Run, fault_at: float, kind: str, memory_interval: str | None) -> dict[str, Any]:
    """Detection and recovery times of one fault and the steps trained twice, from the logs and the run history."""
    steps = step_times(read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted))
    next_step = min((t for t in steps.values() if t > fault_at), default=None)
    detected = next((t for t, text in node_log_lines(run) if t > fault_at and DETECTION[kind] in text), None)
    attempts = history.read_attempts(run.job_dir)
    return {"state": run.state, "detect_s": rounded(detected - fault_at if detected else None),
            "to_next_step_s": rounded(next_step - fault_at if next_step else None),
            "steps_retrained": sum(row.get("steps_retrained", 0) for row in history.as_dicts(attempts)),
            "attempts": len(attempts), "actions": [a.action for a in attempts],
            "causes": [a.cause for a in attempts if a.cause], **snapshot_figures(run, memory_interval)}


def snapshot_figures(run: Run, interval: str | None) -> dict[str, Any]:
    """With the RAM tier on: the median time a snapshot stopped rank 0's training over its median step
    (`snapshot_blocking_ratio`), the same spread over the steps between two snapshots (`snapshot_share`: what
    checkpoint.memory.interval auto keeps <= 0.02), the interval, and the bytes each node copied to its partner per
    snapshot; empty without the tier."""
    lines = read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted)
    blocked = [float(m.group(1)) for ln in lines if (m := BLOCKED.search(ln.text))]
    if not blocked:
        return {}
    steps = sorted(step_times(lines).items())
    intervals = [t1 - t0 for (s0, t0), (s1, t1) in zip(steps, steps[1:]) if s1 == s0 + 1]
    chosen = [int(m.group(1)) for ln in lines if (m := AUTO_INTERVAL.search(ln.text))]
    every = chosen[-1] if chosen else int(interval) if interval and interval.isdigit() else None
    copied = [int(m.group(1)) for _, text in node_log_lines(run) if (m := REPLICATED.search(text))]
    ratio = statistics.median(blocked) / statistics.median(intervals) if intervals else None
    return {"snapshot_blocked_s": rounded(statistics.median(blocked), 3), "snapshot_blocking_ratio": rounded(ratio, 3),
            "memory_interval": every, "snapshot_share": rounded(ratio / every, 3) if ratio and every else None,
            "replicated_bytes_per_snapshot": max(copied) if copied else None}


def faulted(bench: Bench, kind: str, at_step: int) -> dict[str, Any]:
    """Submit, inject `kind` once rank 1 (or its node) reached `at_step`, wait for the end."""
    sets = [f"checkpoint.remote={bench.args.remote_base}/{{job_id}}", "checkpoint.interval=4", *recovery_sets(bench)]
    if kind == "node-spare":
        sets.append("slurm.spare_nodes=1")
    run = bench.submit(*sets)
    if kind in ("crash", "hang"):
        signum = signal.SIGKILL if kind == "crash" else signal.SIGSTOP
        with SignalAtStep(run.job_dir, run.job, {"RANK": "1"}, step_reached(at_step), signum, times=1) as fault:
            bench.wait(run, lambda: bool(fault.times_sent))
        fault_at = fault.times_sent[0]
    else:
        log = run.job_dir / "logs" / "rank-1.log"
        bench.wait(run, lambda: log.exists() and step_reached(at_step)({}, log.read_text(errors="replace")))
        host = history.read_attempts(run.job_dir)[0].hosts[1]
        fault_at = time.time()
        LocalCluster.from_env(bench.env).kill_nodes(host)
    try:
        bench.wait(run)
    finally:
        if kind.startswith("node"):
            LocalCluster.from_env(bench.env).up()
    return after_fault(run, fault_at, kind, bench.args.memory_interval)


def soak(bench: Bench, minutes: float, every_s: float, seed: int) -> dict[str, Any]:
    """One long job with a crash or a hang every `every_s` (+-30%) for `minutes`; then its goodput."""
    rng = random.Random(seed)
    run = bench.submit(f"checkpoint.remote={bench.args.remote_base}/{{job_id}}",
                       f"checkpoint.interval={bench.args.soak_checkpoint_interval}",
                       "torchtitan.args.training.steps=100000", "slurm.time=02:00:00", *recovery_sets(bench))
    log = run.job_dir / "logs" / "rank-0.log"
    bench.wait(run, lambda: log.exists() and step_reached(1)({}, log.read_text(errors="replace")))
    start, faults = time.time(), []
    while time.time() - start < minutes * 60:
        time.sleep(min(every_s * rng.uniform(0.7, 1.3), max(0.0, start + minutes * 60 - time.time())))
        if time.time() - start >= minutes * 60:
            break
        kind = rng.choice(("crash", "hang"))
        signum = signal.SIGKILL if kind == "crash" else signal.SIGSTOP
        with SignalAtStep(run.job_dir, run.job, {"RANK": str(rng.randrange(2))}, lambda env, text: True,
                          signum, times=1) as fault:
            deadline = time.time() + 120
            while not fault.times_sent and time.time() < deadline:
                time.sleep(0.2)
        faults.append({"kind": kind, "at_s": rounded(time.time() - start)})
    end = time.time()
    subprocess.run(["scancel", run.job], env=bench.env, check=False)
    bench.live.discard(run.job)
    lines = [ln for ln in read_lines(log, run.submitted) if start <= ln.t <= end]
    steps = [(int(m.group(1)), ln.t) for ln in lines if (m := STEP.match(ln.text))]
    trained = [step for step, _ in steps]
    distinct = len(set(trained))
    attempt_starts = [a.started for a in history.read_attempts(run.job_dir) if a.started]
    per_step = uninterrupted_intervals(steps, attempt_starts)
    wall = end - start
    named = [slow for attempt in history.read_attempts(run.job_dir) for slow in attempt.slow]
    lost = lost_by_cause(lines, attempt_starts, statistics.median(per_step))
    quiet = lost.get("neither", {}).get("median_s")
    return {"minutes": minutes, "faults": faults, "slow_false_positives": named,
            "slow_false_positives_per_hour": rounded(len(named) / (wall / 3600), 2),
            "steps_trained": len(trained), "distinct_steps": distinct,
            "steps_retrained": len(trained) - distinct, "step_s": rounded(statistics.mean(per_step), 3),
            "median_step_s": rounded(statistics.median(per_step), 3),
            "goodput": rounded(distinct * statistics.mean(per_step) / wall, 3),
            "goodput_strict": rounded(distinct * statistics.median(per_step) / wall, 3),
            "goodput_save_free": rounded(distinct * quiet / wall, 3) if quiet else None,
            "lost_by_cause": lost,
            **snapshot_figures(run, bench.args.memory_interval)}


def lost_by_cause(lines: list[Line], attempt_starts: list[float], median_s: float) -> dict[str, dict[str, Any]]:
    """Where the strict measure's time went: rank 0's intervals between consecutive logged steps, by what followed
    the first (a RAM snapshot, a store checkpoint's save, both, neither; a fault: the interval spans an attempt's
    start), each class's count, median and the sum of its intervals less the soak's median step (`beyond_s`)."""
    steps: list[tuple[int, float]] = []
    after: list[set[str]] = []  # what rank 0 logged after each step, before the next one
    for ln in lines:
        if m := STEP.match(ln.text):
            steps.append((int(m.group(1)), ln.t))
            after.append(set())
        elif after and SNAPSHOT.search(ln.text):
            after[-1].add("snapshot")
        elif after and ln.text.startswith(STORE_SAVE):
            after[-1].add("checkpoint")
    classes: dict[str, list[float]] = {}
    for (s0, t0), (s1, t1), followed in zip(steps, steps[1:], after):
        if any(t0 < started <= t1 for started in attempt_starts):
            cause = "fault"
        elif s1 != s0 + 1:
            continue
        else:
            cause = " and ".join(sorted(followed, reverse=True)) or "neither"  # "snapshot and checkpoint"
        classes.setdefault(cause, []).append(t1 - t0)
    return {cause: {"n": len(spans), "median_s": rounded(statistics.median(spans), 3),
                    "beyond_s": rounded(sum(spans) - median_s * len(spans), 1)} for cause, spans in classes.items()}


def recovery_sets(bench: Bench) -> list[str]:
    """The RAM tier's settings (--memory-interval), none when it is off; the standby step's (--standby)."""
    interval = bench.args.memory_interval
    tier = [] if interval is None else ["checkpoint.memory.enable=true", f"checkpoint.memory.interval={interval}"]
    return tier + (["preemption.standby_step=true"] if bench.args.standby else [])


def uninterrupted_intervals(steps: list[tuple[int, float]], attempt_starts: list[float]) -> list[float]:
    """The soak's own uninterrupted time per step (the machine's load drifts between jobs, so it is taken
    from the soak itself): the intervals between consecutive steps of one attempt (none spanning an attempt's
    start). Their mean is what an uninterrupted run of the job pays per step, its checkpoint saves included:
    `goodput` = distinct steps x that mean / wall time. Their median leaves the saves and the spread of step
    times out: `goodput_strict` counts them as lost too."""
    return [t1 - t0 for (s0, t0), (s1, t1) in zip(steps, steps[1:])
            if s1 == s0 + 1 and not any(t0 < started <= t1 for started in attempt_starts)]


def one_repeat(bench: Bench, runs: list[Run], _index: int) -> dict[str, Any]:
    return {kind: faulted(bench, kind, bench.args.at_step) for kind in bench.args.faults}


def table(results: list[dict[str, Any]]) -> str:
    rows = [f"{'fault':<14}{'detect s':>18}{'fault -> next step s':>24}{'retrained':>11}  attempts / actions"]
    for kind in results[0]:
        per = [r[kind] for r in results]
        rows.append(f"{kind:<14}{median_spread([p['detect_s'] for p in per]):>18}"
                    f"{median_spread([p['to_next_step_s'] for p in per]):>24}"
                    f"{median_spread([p['steps_retrained'] for p in per]):>11}  "
                    f"{per[0]['attempts']} / {','.join(a or '-' for a in per[0]['actions'])}")
    return "\n".join(rows)


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--at-step", type=int, default=7, help="inject once rank 1 logged this step (default 7)")
    ap.add_argument("--faults", nargs="*", choices=FAULTS, default=list(FAULTS),
                    help="the fault kinds to time (default all; none with --soak-minutes: the soak only)")
    ap.add_argument("--soak-minutes", type=float, default=0, help="then a soak of this many minutes (goal 20)")
    ap.add_argument("--fault-every", type=float, default=150, help="seconds between soak faults (default 150)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--soak-checkpoint-interval", type=int, default=10,
                    help="the soak's checkpoint.interval (default 10)")
    ap.add_argument("--memory-interval", default=None,
                    help="turn the RAM tier on: checkpoint.memory.interval (a step count or auto; default off)")
    ap.add_argument("--standby", action="store_true",
                    help="preemption.standby_step: each attempt's next step started, imported, as it trains")
    ap.set_defaults(remote="s3")
    args = ap.parse_args()
    code = 0
    if args.faults:
        code = run_repeats(args, "bench-faults-", {"at_step": args.at_step, "faults": args.faults}, one_repeat, table)
    if args.soak_minutes:
        run_repeats(args, "bench-soak-", {"soak_minutes": args.soak_minutes},
                    lambda bench, runs, _i: soak(bench, args.soak_minutes, args.fault_every, args.seed),
                    lambda results: json.dumps(results[-1], indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
