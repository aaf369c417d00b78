#!/usr/bin/env python3
"""Benchmark: slow nodes (issue 26): what the sampler costs a step, how soon a slow node is named, how often a
healthy one is, and what a swap is worth.

    .venv/bin/python -m tools.bench.straggler [--cost] [--detect 1.2 1.5 2] [--healthy-minutes 5] [--json out.json]

- cost: one `rank_progress.step_done` (its schedstat reading of every thread of the rank: records.schedstat)
  against one training step of llama3_debugmodel (configs/debug_cpu.yaml's batch: 4 x 256 tokens, forward,
  backward, AdamW), both in this process, so that the rank's threads are torch's own. Goal: <= 1 % of a step;
- detection: `--nodes` real processes, one per node, train synchronously (a fixed amount of CPU work per step,
  then a barrier that blocks, as gloo's waits do); each writes its progress record as a rank does, the node's
  timing goes through the supervisor's TimingReport and the files, and the batch shell's judge reads them every
  5 s (node.batch.slow_watch.POLL_S) with the defaults (threshold 0.8, window: 60 s of steps, 5 warm-up steps).
  After `--healthy-s` one node is put in a cgroup capped at 1/slowdown of the CPU share it was getting while it
  ran (measured over 2 s: on a shared machine a quota of a whole CPU would not bind;
  tools/local_cluster/cpu_throttle.py, needs root), then steered every 5 s towards the slowdown asked for (the
  quota scaled by the last 5 s's step time over the healthy one, against the target: on a loaded machine a
  fixed quota slows a process by more or less than asked). Reported: seconds from the throttle to the verdict
  (None: not named within `--limit-s`), and the slowdown it really had (step time after the throttle over
  before);
- false positives: the same, nobody throttled, for `--healthy-minutes`: nodes named per hour (on this machine's
  load: 2 CPUs shared with other work, the harshest noise a judge here sees);
- goodput of a run with one slow node, with and without the swap, from the measured detection time, a swap's
  cost (`--swap-cost-s`: restart + one step; the local cluster's in-allocation restart, tools/bench/fault_recovery
  node-spare) and a run of `--run-minutes` whose node slows to 1/slowdown from its start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_titan.node.batch.slow_watch import POLL_S
from slurm_titan.node.batch.straggler import Judge
from slurm_titan.node.supervisor.timing import TimingReport
from slurm_titan.records import node_timing, rank_progress
from slurm_titan.records.rank_progress import Phase
from slurm_titan.records.schedstat import WantedTime
from tools.local_cluster.cpu_throttle import CpuThrottle, cpus_when_running

WATCHDOG_POLL_S = 0.5  # how often the supervisor reads the records (node.supervisor.supervisor.POLL_S)
THROTTLE_MEASURE_S = 2.0  # the victim's CPU use is measured this long; its quota is that / slowdown
STEER_S = 5.0  # the quota is corrected towards the slowdown asked for this often


def busy(iterations: int) -> None:
    total = 0
    for i in range(iterations):
        total += i * i


def iterations_for(seconds: float) -> int:
    """Loop iterations that take `seconds` of CPU here (median of a few tries)."""
    tries = []
    for _ in range(5):
        start = time.process_time()
        busy(200_000)
        tries.append(time.process_time() - start)
    return max(1, int(200_000 * seconds / statistics.median(tries)))


def _rank(path: str, barrier: Any, iterations: int, stop: Any) -> None:
    """One node's rank: a fixed amount of CPU work per step, then every rank waits for the others."""
    writer = rank_progress.ProgressWriter(path)
    writer.enter(Phase.STEP, 1)
    step = 1
    while not stop.is_set():
        busy(iterations)
        try:
            barrier.wait(timeout=60)
        except Exception:  # noqa: BLE001 - the barrier is broken at the end
            return
        writer.step_done(step)
        step += 1


class SyncRanks:
    """`nodes` processes training synchronously, each its own node; their records in a temporary folder."""

    def __init__(self, nodes: int, step_s: float) -> None:
        self.nodes, self.iterations = nodes, iterations_for(step_s)
        self.folder = Path(tempfile.mkdtemp(prefix="slurm-titan-straggler-"))
        self.context = multiprocessing.get_context("fork")
        self.stop = self.context.Event()
        self.barrier = self.context.Barrier(nodes)
        self.records = [self.folder / f"rank-{node}.progress" for node in range(nodes)]
        self.processes: list[Any] = []

    def __enter__(self) -> SyncRanks:
        for path in self.records:
            rank_progress.create(path, time.time())
        self.processes = [self.context.Process(target=_rank, args=(str(path), self.barrier, self.iterations,
                                                                   self.stop), daemon=True)
                          for path in self.records]
        for process in self.processes:
            process.start()
        return self

    def read(self, node: int) -> dict[int, rank_progress.Progress]:
        record = rank_progress.read(self.records[node])
        return {node: record} if record else {}

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.barrier.abort()
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def judged_run(*, nodes: int, step_s: float, slowdown: float | None, healthy_s: float, limit_s: float,
               threshold: float = 0.8, window_steps: int | None = None, warmup_steps: int = 5,
               poll_s: float = POLL_S) -> dict[str, Any]:
    """One run as the module docstring says: the seconds from the throttle (or the start, healthy) to each
    verdict, the window the judge sized, and the last scores."""
    hosts = [f"n{node + 1}" for node in range(nodes)]
    job_dir = Path(tempfile.mkdtemp(prefix="slurm-titan-straggler-job-"))

    def new_judge() -> Judge:  # a healthy run judges on after a false verdict, as a next attempt would
        return Judge(attempt=0, hosts=hosts, threshold=threshold, window_steps=window_steps,
                     warmup_steps=warmup_steps)

    judge, window, at_throttle, steered, healthy_step_s, next_steer = new_judge(), None, None, None, None, 0.0
    reports = [TimingReport(job_dir, 0, node, hosts[node]) for node in range(nodes)]
    named: list[dict[str, Any]] = []
    last: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        ranks = stack.enter_context(SyncRanks(nodes, step_s))
        start = time.time()
        throttled_at = None
        next_judge = start + poll_s
        while time.time() - (throttled_at or start) < limit_s:
            now = time.time()
            if slowdown and throttled_at is None and now - start >= healthy_s:
                victim = ranks.processes[-1].pid
                cpus = cpus_when_running([victim], THROTTLE_MEASURE_S)
                throttle = stack.enter_context(CpuThrottle(f"slurm-titan-bench-{int(start)}", cpus / slowdown))
                throttle.add(victim)
                throttled_at = now = time.time()
                at_throttle = steered = rank_progress.read(ranks.records[0])
                healthy_step_s = at_throttle.wall_s / max(1, at_throttle.steps_done) if at_throttle else None
                next_steer = now + STEER_S
            if throttled_at is not None and now >= next_steer and healthy_step_s:
                record, next_steer = rank_progress.read(ranks.records[0]), now + STEER_S
                if record and steered and record.steps_done > steered.steps_done:
                    recent = (record.wall_s - steered.wall_s) / (record.steps_done - steered.steps_done)
                    correction = min(2.0, max(0.5, recent / healthy_step_s / slowdown))
                    throttle.set_cpus(throttle.quota_us / throttle.period_us * correction)
                    steered = record
            for node, report in enumerate(reports):
                report.offer(ranks.read(node), now)
            if now >= next_judge:
                next_judge = now + poll_s
                line, candidate = judge.offer(node_timing.read_all(job_dir, 0), now)
                last, window = (line.scores if line else last), judge.window or window
                if candidate:
                    named.append({"host": candidate.host, "after_s": round(now - (throttled_at or start), 1),
                                  "score": round(candidate.score, 3), "step": candidate.step})
                    if slowdown:
                        break
                    judge = new_judge()
            time.sleep(WATCHDOG_POLL_S)
        steps = rank_progress.read(ranks.records[0])
    real = None
    if throttled_at is not None and at_throttle and steps and steps.steps_done > at_throttle.steps_done:
        before = at_throttle.wall_s / max(1, at_throttle.steps_done)
        after = (steps.wall_s - at_throttle.wall_s) / (steps.steps_done - at_throttle.steps_done)
        real = round(after / before, 2)
    return {"slowdown": slowdown, "real_slowdown": real, "threshold": threshold, "window_steps": window, "named": named,
            "detect_s": named[0]["after_s"] if named and slowdown else None, "last_scores": last,
            "steps": steps.steps_done if steps else 0, "seconds": round(time.time() - start, 1)}


def sampler_cost(steps: int, calls: int) -> dict[str, Any]:
    """The sampler's and the whole hook's cost against a debug-model step, in this process."""
    import torch
    from torchtitan.config import apply_overrides
    from torchtitan.config.manager import ConfigManager

    from slurm_titan.overrides import DEFAULT_CPU_OVERRIDES

    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel",
                                         "--override.imports", ",".join(DEFAULT_CPU_OVERRIDES)])
    config.model_spec.model.update_from_config(config=config)
    apply_overrides(config.override, config)
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    model.init_states(buffer_device=torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, positions = torch.randint(0, 2048, (4, 256)), torch.arange(256).repeat(4, 1)

    def step() -> float:
        begin = time.perf_counter()
        loss = model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
        loss = loss.float().logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - begin

    step()  # warm-up
    step_times = [step() for _ in range(steps)]
    wanted = WantedTime()
    begin = time.perf_counter()
    for _ in range(calls):
        wanted.sample()
    sample_s = (time.perf_counter() - begin) / calls
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as folder:
        path = Path(folder) / "rank-0.progress"
        rank_progress.create(path, time.time())
        writer = rank_progress.ProgressWriter(str(path))
        writer.enter(Phase.STEP, 1)
        begin = time.perf_counter()
        for n in range(calls):
            writer.step_done(n)
        hook_s = (time.perf_counter() - begin) / calls
    step_s = statistics.median(step_times)
    return {"threads": len(list(Path("/proc/self/task").iterdir())), "step_ms": round(step_s * 1000, 1),
            "sample_us": round(sample_s * 1e6, 1), "hook_us": round(hook_s * 1e6, 1),
            "hook_share_of_step_pct": round(100 * hook_s / step_s, 4)}


def goodput(run_s: float, slowdown: float, detect_s: float, swap_cost_s: float) -> dict[str, float]:
    """A run of `run_s` seconds of healthy-speed work whose node is slow (1/slowdown) from the start: its goodput
    (the healthy time the work takes over the wall time) alone, and with a swap after `detect_s` that costs
    `swap_cost_s` (the work done meanwhile at the slow pace counts)."""
    without = run_s * slowdown
    done_slow = detect_s / slowdown
    with_swap = detect_s + swap_cost_s + (run_s - done_slow)
    return {"without_swap": round(run_s / without, 3), "with_swap": round(run_s / with_swap, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", action="store_true", help="the sampler's cost against a debug-model step")
    parser.add_argument("--cost-steps", type=int, default=10)
    parser.add_argument("--cost-calls", type=int, default=2000)
    parser.add_argument("--detect", type=float, nargs="*", default=[], help="slowdowns to detect (1.2 1.5 2)")
    parser.add_argument("--also-threshold", type=float, default=0.9,
                        help="repeat slowdowns above 1/threshold (1.2x) at this threshold too")
    parser.add_argument("--healthy-minutes", type=float, default=0, help="a run without a slow node (false positives)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=0.2, help="CPU work per step (default 0.2 s)")
    parser.add_argument("--healthy-s", type=float, default=20.0, help="healthy seconds before the throttle")
    parser.add_argument("--limit-s", type=float, default=180.0, help="give up on a verdict after this long")
    parser.add_argument("--run-minutes", type=float, default=60.0, help="the goodput model's run")
    parser.add_argument("--swap-cost-s", type=float, default=60.0, help="the goodput model's swap cost")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    if args.cost:
        result["cost"] = sampler_cost(args.cost_steps, args.cost_calls)
        print(f"sampler: {result['cost']}")
    runs = []
    for slowdown in args.detect:
        runs.append(judged_run(nodes=args.nodes, step_s=args.step_s, slowdown=slowdown, healthy_s=args.healthy_s,
                               limit_s=args.limit_s))
        print(f"detection: {runs[-1]}", flush=True)
        if 1 / slowdown >= 0.8 and args.also_threshold:
            runs.append(judged_run(nodes=args.nodes, step_s=args.step_s, slowdown=slowdown, healthy_s=args.healthy_s,
                                   limit_s=args.limit_s, threshold=args.also_threshold))
            print(f"detection: {runs[-1]}", flush=True)
    if runs:
        result["detection"] = runs
        result["goodput"] = {str(r["real_slowdown"]): goodput(args.run_minutes * 60, r["real_slowdown"],
                                                              r["detect_s"], args.swap_cost_s)
                             for r in runs if r["detect_s"] is not None and r["real_slowdown"]}
        print(f"goodput: {result['goodput']}")
    if args.healthy_minutes:
        healthy = judged_run(nodes=args.nodes, step_s=args.step_s, slowdown=None, healthy_s=0,
                             limit_s=args.healthy_minutes * 60)
        healthy["false_positives_per_hour"] = round(len(healthy["named"]) / (healthy["seconds"] / 3600), 2)
        result["healthy"] = healthy
        print(f"healthy: {healthy}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
