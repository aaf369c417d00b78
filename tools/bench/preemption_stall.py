#!/usr/bin/env python3
"""Benchmark: what one preemption costs a run, and where the time goes (issue 5, part 6).

    eval "$(tools/local-cluster env)"
    .venv/bin/python tools/bench/preemption_stall.py --steps 20 --at-step 6 [--remote dir|s3] [--json out.json]

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
  submitit, up to the supervisor's "attempt 1:" line), restore (the newest complete checkpoint
  downloaded to local disk: "resuming complete checkpoint"), torchtitan start-up (imports, init,
  DCP load, the first step);

and reports wall time (submit -> the last attempt's end) preempted / reference, also without
the wait for nodes before the first start (another job on the cluster moves that, not the
preemption). The 1-min load average (sampled while each job runs) and other jobs in the queue are
recorded with each run: on 2 shared cores other work moves every figure.

Job state comes from ``slurm_titan.status.describe`` in this process (what ``slurm-titan status
--json`` prints), so that polling starts no Python process. Everything goes to a private
SLURM_TITAN_HOME, runs folder and remote under a temporary folder, removed at the end with the
jobs' node-local checkpoint folders (unless --keep).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from slurm_titan import history, registry, status  # noqa: E402

CONFIG = "configs/debug_cpu.yaml"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN = re.compile(r"^\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - \S+ - \w+ - (.*)$")
SUBMITIT = re.compile(r"^submitit \w+ \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\) - (.*)$")
SAY = re.compile(r"^\[slurm-titan \S+ (\d\d:\d\d:\d\d)\.(\d{3})\] (.*)$")
STEP = re.compile(r"^step:\s*(\d+)\s+loss:")

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
    ("torchtitan start-up", "resuming", "first_step", 1),
    ("imports (-> first [titan] line)", "resuming", "titan_up", 2),
    ("init (-> 'Loading the checkpoint')", "titan_up", "load", 2),
    ("DCP load", "load", "loaded", 2),
    ("first step (-> its log line)", "loaded", "first_step", 2),
    ("signal -> first step of attempt 1", "signal", "first_step", 0),
]


@dataclass
class Line:
    t: float
    text: str


@dataclass
class Run:
    """One job as this bench saw it."""

    job: str
    job_dir: Path
    submitted: float
    signalled: float | None = None
    load: list[float] = field(default_factory=list)
    other_jobs: int = 0
    state: str = "?"
    attempts: list[history.Attempt] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        first, last = self.attempts[0] if self.attempts else None, self.attempts[-1] if self.attempts else None
        ended = last.ended if last else None
        return {"job": self.job, "state": self.state, "attempts": len(self.attempts),
                "wall_s": _round(ended - self.submitted if ended else None),
                "queued_s": _round(first.started - self.submitted if first and first.started else None),
                "running_s": _round(ended - first.started if ended and first and first.started else None),
                "load_1min_mean": _round(statistics.fmean(self.load) if self.load else None, 2),
                "other_jobs_in_queue": self.other_jobs}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _epoch(date_time: str, millis: str) -> float:
    return dt.datetime.strptime(date_time, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000


def read_lines(path: Path, around: float) -> list[Line]:
    """The stamped lines of a rank or node log, as epoch times (local clock). Supervisor lines
    carry no date: theirs is the one that puts them closest after `around` (the submit time)."""
    day = dt.datetime.fromtimestamp(around).date()
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        raw = ANSI.sub("", raw)
        if m := TITAN.match(raw) or SUBMITIT.match(raw):
            lines.append(Line(_epoch(m.group(1), m.group(2)), m.group(3)))
        elif m := SAY.match(raw):
            t = _epoch(f"{day} {m.group(1)}", m.group(2))
            lines.append(Line(t + 86400 if t < around - 3600 else t, m.group(3)))
    return lines


def first_after(lines: list[Line], pattern: str, after: float | None) -> float | None:
    if after is None:
        return None
    return next((ln.t for ln in lines if ln.t >= after and re.search(pattern, ln.text)), None)


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
    m["titan_up"] = first_after(rank0, r"", m["resuming"])
    m["load"] = first_after(rank0, r"^Loading the checkpoint", m["titan_up"])
    m["loaded"] = first_after(rank0, r"^Finished loading the checkpoint", m["load"])
    m["first_step"] = a1.first_step_time
    return m


def phases(m: dict[str, float | None]) -> dict[str, float | None]:
    return {label: _round(m[b] - m[a] if m[a] is not None and m[b] is not None else None, 2)  # type: ignore[operator]
            for label, a, b, _ in PHASES}


def reference_figures(run: Run) -> dict[str, float | None]:
    """Start-up (supervisor -> first step) and the mean step time of the uninterrupted run."""
    rank0 = read_lines(run.job_dir / "logs" / "rank-0.log", run.submitted)
    steps = [ln.t for ln in rank0 if STEP.match(ln.text)]
    a0 = run.attempts[0] if run.attempts else history.Attempt(0)
    startup = a0.first_step_time - a0.started if a0.first_step_time and a0.started else None
    step_s = (steps[-1] - steps[1]) / (len(steps) - 2) if len(steps) > 2 else None
    return {"startup_s": _round(startup, 2), "step_s": _round(step_s, 2)}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
        self.args, self.work, self.env = args, work, env
        self.remote = f"{args.remote_base}/{{job_id}}"
        self.live: set[str] = set()  # submitted and not seen finished: cancelled on the way out

    def submit(self) -> Run:
        cmd = [sys.executable, "-m", "slurm_titan.cli", "submit", CONFIG,
               "--set", f"torchtitan.args.training.steps={self.args.steps}", "--set", "checkpoint.interval=1000",
               "--set", f"runs_dir={self.work / 'runs'}", "--set", f"checkpoint.remote={self.remote}"]
        submitted = time.time()
        out = subprocess.run(cmd, env=self.env, cwd=REPO, text=True, capture_output=True, timeout=120)
        match = re.search(r"submitted job (\d+)", out.stdout)
        if out.returncode != 0 or not match:
            raise RuntimeError(f"submit failed ({out.returncode}): {out.stdout}{out.stderr}")
        job = match.group(1)
        self.live.add(job)
        others = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, text=True, capture_output=True)
        return Run(job, registry.load(job).folder, submitted,
                   other_jobs=len([j for j in others.stdout.split() if j != job]))

    def wait(self, run: Run, until: Callable[[], bool] | None = None, interval: float = 2.0) -> None:
        """Poll until the job ends (or until `until()` is true); samples the load average."""
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            run.load.append(os.getloadavg()[0])
            if until is not None:
                if until():
                    return
            elif (state := status.describe(run.job)["state"]) in FINISHED:
                run.state = state
                self.live.discard(run.job)
                run.attempts = history.read_attempts(run.job_dir)
                return
            time.sleep(0.2 if until else interval)
        raise TimeoutError(f"job {run.job}: still waiting after {self.args.timeout}s")

    def reference(self) -> Run:
        run = self.submit()
        self.wait(run)
        return run

    def preempted(self) -> Run:
        run = self.submit()
        log, want = run.job_dir / "logs" / "rank-0.log", self.args.at_step

        def reached() -> bool:
            return log.exists() and any((m := STEP.match(ln.text)) and int(m.group(1)) >= want
                                        for ln in read_lines(log, run.submitted))

        self.wait(run, reached)
        run.signalled = time.time()
        subprocess.run(["scancel", "--signal=USR2", run.job], env=self.env, check=True, timeout=60)
        self.wait(run)
        return run

    def cleanup(self, runs: list[Run]) -> None:
        for job in self.live:
            subprocess.run(["scancel", job], env=self.env, check=False)
        if self.args.keep:
            return
        scratch = Path(os.environ.get("SLURM_TITAN_CLUSTER_DIR", "/var/tmp/slurm-titan-cluster")) / "nodes"
        for run in runs:
            for folder in scratch.glob(f"*/scratch/*/{run.job}"):
                shutil.rmtree(folder, ignore_errors=True)


def one_repeat(bench: Bench, runs: list[Run]) -> dict[str, Any]:
    ref = bench.reference()
    runs.append(ref)
    pre = bench.preempted()
    runs.append(pre)
    r, p = ref.summary(), pre.summary()
    ratio = {key: _round(p[key] / r[key], 2) if p[key] and r[key] else None for key in ("wall_s", "running_s")}
    a0 = pre.attempts[0] if pre.attempts else history.Attempt(0)
    a1 = pre.attempts[1] if len(pre.attempts) > 1 else history.Attempt(1)
    return {"reference": r | reference_figures(ref), "preempted": p, "phases_s": phases(milestones(pre)),
            "stopped_at_step": a0.stopped_at_step, "resumed_at_step": a1.first_step,
            "attempt_reasons": [a.reason for a in pre.attempts], "ratio_preempted_over_reference": ratio}


def table(results: list[dict[str, Any]]) -> str:
    def med(values: list[float | None], digits: int = 1) -> str:
        vals = [v for v in values if v is not None]
        if not vals:
            return "-"
        spread = f"  ({min(vals):.{digits}f}-{max(vals):.{digits}f})" if len(vals) > 1 else ""
        return f"{statistics.median(vals):7.{digits}f}{spread}"

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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--at-step", type=int, default=6, help="signal once rank 0 logged this step (default 6)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--remote", choices=["dir", "s3"], default="dir", help="checkpoint remote (default dir)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for one job")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and node-local checkpoints")
    args = ap.parse_args()
    if "SLURM_CONF" not in os.environ:
        ap.error('run `eval "$(tools/local-cluster env)"` first')
    work = Path(tempfile.mkdtemp(prefix="bench-stall-"))
    os.environ["SLURM_TITAN_HOME"] = str(work / "home")  # for status.describe / registry in this process
    env = dict(os.environ)
    server = None
    if args.remote == "s3":
        from local_s3.seaweed import Server, free_port

        server = Server(port=free_port(), data_dir=str(work / "s3"), bucket="slurm-titan-bench").start(
            die_with_parent=True)
        env |= server.env()
        args.remote_base = "s3://slurm-titan-bench/runs"
    else:
        args.remote_base = str(work / "remote")
    print(f"work folder {work}; {args.steps} steps, USR2 at step {args.at_step}, remote {args.remote}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    bench, runs, results = Bench(args, work, env), [], []
    try:
        for i in range(args.repeats):
            results.append(one_repeat(bench, runs))
            print(f"repeat {i + 1}: {json.dumps(results[-1])}", flush=True)
    finally:
        bench.cleanup(runs)
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "at_step": args.at_step, "remote": args.remote,
                                               "cpus": os.cpu_count(), "repeats": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
