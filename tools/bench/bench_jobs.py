"""What the benchmarks in this folder share: submit debug-cpu jobs to the local Slurm cluster,
follow them to the end without starting a Python process per poll, read the stamped lines of
their logs, and start a private S3 store.

Job state comes from ``slurm_titan.launch.status.describe`` in this process (what ``slurm-titan status
--json`` prints). Everything goes to a private SLURM_TITAN_HOME and runs folder under the work
folder; cleanup cancels what is still running and removes the jobs' node-local checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_titan.cpulist import format_cpu_list, parse_cpu_list
from slurm_titan.launch import status
from slurm_titan.records import history, jobs

REPO = Path(__file__).resolve().parents[2]

CONFIG = "configs/debug_cpu.yaml"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITAN = re.compile(r"^\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - \S+ - \w+ - (.*)$")
SUBMITIT = re.compile(r"^submitit \w+ \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\) - (.*)$")
SAY = re.compile(r"^\[slurm-titan \S+ (\d\d:\d\d:\d\d)\.(\d{3})\] (.*)$")
STEP = re.compile(r"^step:\s*(\d+)\s+loss:")

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
                "wall_s": rounded(ended - self.submitted if ended else None),
                "queued_s": rounded(first.started - self.submitted if first and first.started else None),
                "running_s": rounded(ended - first.started if ended and first and first.started else None),
                "load_1min_mean": rounded(statistics.fmean(self.load) if self.load else None, 2),
                "other_jobs_in_queue": self.other_jobs}


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def epoch(date_time: str, millis: str) -> float:
    return dt.datetime.strptime(date_time, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000


def read_lines(path: Path, around: float) -> list[Line]:
    """The stamped lines of a rank or node log, as epoch times (local clock). Supervisor lines
    carry no date: theirs is the one that puts them closest after `around` (the submit time)."""
    day = dt.datetime.fromtimestamp(around).date()
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        raw = ANSI.sub("", raw)
        if m := TITAN.match(raw) or SUBMITIT.match(raw):
            lines.append(Line(epoch(m.group(1), m.group(2)), m.group(3)))
        elif m := SAY.match(raw):
            t = epoch(f"{day} {m.group(1)}", m.group(2))
            lines.append(Line(t + 86400 if t < around - 3600 else t, m.group(3)))
    return lines


def first_after(lines: list[Line], pattern: str, after: float | None) -> float | None:
    if after is None:
        return None
    return next((ln.t for ln in lines if ln.t >= after and re.search(pattern, ln.text)), None)


def pin_threads(pid: int, cpus: frozenset[int]) -> None:
    """Pin the threads of process `pid` that still may run on every CPU to `cpus` (threads they
    start later inherit it); threads that chose their own CPUs (checkpoint.upload_cpus) stay."""
    every = set(range(os.cpu_count() or 1))
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(int(tid)) == every:
                    os.sched_setaffinity(int(tid), cpus)


def job_pids(job: str) -> list[int]:
    """The processes on this machine that run Slurm job `job` (SLURM_JOB_ID in their environment)."""
    marker = f"\0SLURM_JOB_ID={job}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and marker in b"\0" + Path(f"/proc/{entry}/environ").read_bytes():
                pids.append(int(entry))
    return pids


class Bench:
    """Submits configs/debug_cpu.yaml variants to the local cluster and follows them to the end."""

    def __init__(self, args: argparse.Namespace, work: Path, env: dict[str, str], server: Any = None) -> None:
        self.args, self.work, self.env, self.server = args, work, env, server
        self.live: set[str] = set()  # submitted and not seen finished: cancelled on the way out

    def store_cpu_s(self) -> float | None:
        """CPU seconds the private S3 server (--remote s3) has used so far; None without one."""
        pid = self.server.running_pid() if self.server is not None else None
        if pid is None:
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def submit(self, *sets: str) -> Run:
        """Submit with `--set` each of `sets` (KEY=VALUE) after the steps and a private runs folder."""
        cmd = [sys.executable, "-m", "slurm_titan.cli.main", "submit", CONFIG, "--nodes", str(self.args.nodes),
               "--set", f"torchtitan.args.training.steps={self.args.steps}", "--set", f"runs_dir={self.work / 'runs'}"]
        if self.args.upload_cpus is not None:
            cmd += ["--set", f"checkpoint.upload_cpus={format_cpu_list(self.args.upload_cpus)}"]
        for item in sets:
            cmd += ["--set", item]
        submitted = time.time()
        out = subprocess.run(cmd, env=self.env, cwd=REPO, text=True, capture_output=True, timeout=120)
        match = re.search(r"submitted job (\d+)", out.stdout)
        if out.returncode != 0 or not match:
            raise RuntimeError(f"submit failed ({out.returncode}): {out.stdout}{out.stderr}")
        job = match.group(1)
        self.live.add(job)
        others = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, text=True, capture_output=True)
        return Run(job, jobs.load(job).folder, submitted,
                   other_jobs=len([j for j in others.stdout.split() if j != job]))

    def wait(self, run: Run, until: Callable[[], bool] | None = None, interval: float = 2.0) -> None:
        """Poll until the job ends (or until `until()` is true: RuntimeError if the job ends first);
        samples the load average."""
        deadline, checked = time.monotonic() + self.args.timeout, 0.0
        while time.monotonic() < deadline:
            run.load.append(os.getloadavg()[0])
            if self.args.training_cpus is not None:
                for pid in job_pids(run.job):
                    pin_threads(pid, self.args.training_cpus)
            if until is not None and until():
                return
            if until is None or time.monotonic() - checked >= interval:
                checked = time.monotonic()
                if (state := status.describe(run.job)["state"]) in FINISHED:
                    run.state = state
                    self.live.discard(run.job)
                    run.attempts = history.read_attempts(run.job_dir)
                    if until is not None:
                        raise RuntimeError(f"job {run.job} ended ({state}) before what this bench waits for")
                    return
            time.sleep(0.2 if until else interval)
        raise TimeoutError(f"job {run.job}: still waiting after {self.args.timeout}s")

    def run_to_end(self, *sets: str) -> Run:
        run = self.submit(*sets)
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


def step_times(lines: list[Line]) -> dict[int, float]:
    """When each training step was logged (epoch seconds) in a rank log's `lines`; the last time
    wins across attempts."""
    return {int(m.group(1)): ln.t for ln in lines if (m := STEP.match(ln.text))}


def median_spread(values: list[float | None], digits: int = 1) -> str:
    """`median  (min-max)` of the values that are there, '-' if none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    spread = f"  ({min(vals):.{digits}f}-{max(vals):.{digits}f})" if len(vals) > 1 else ""
    return f"{statistics.median(vals):7.{digits}f}{spread}"


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every job benchmark takes; add its own, then pass the result to run_repeats."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes, one rank each (default 2)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--remote", choices=["dir", "s3"], default="dir", help="checkpoint remote (default dir)")
    ap.add_argument("--training-cpus", type=parse_cpu_list, help="pin the jobs' processes to these CPUs (a list "
                    "such as 0 or 0-3), all but the uploader, which --upload-cpus gives CPUs of its own")
    ap.add_argument("--upload-cpus", type=parse_cpu_list, help="checkpoint.upload_cpus for every job: the "
                    "uploader runs on these CPUs, as on a cluster node where training leaves host cores free")
    ap.add_argument("--store-cpus", type=parse_cpu_list, help="with --remote s3: pin the S3 server to these CPUs "
                    "(on a cluster it runs elsewhere)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for one job")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and node-local checkpoints")
    return ap


def run_repeats(args: argparse.Namespace, prefix: str, settings: dict[str, Any],
                one_repeat: Callable[[Bench, list[Run], int], dict[str, Any]],
                table: Callable[[list[dict[str, Any]]], str]) -> int:
    """Run `one_repeat` --repeats times (printing each result), clean up, print `table(results)`;
    with --json also write the settings and results there."""
    work, env, server = _start_work(args, prefix)
    print(f"work folder {work}; {args.nodes} nodes, {args.steps} steps, remote {args.remote}, "
          + ", ".join(f"{k} {v}" for k, v in settings.items())
          + f"; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    bench, runs, results = Bench(args, work, env, server), [], []
    try:
        for i in range(args.repeats):
            results.append(one_repeat(bench, runs, i))
            print(f"repeat {i + 1}: {json.dumps(results[-1])}", flush=True)
    finally:
        _finish_work(bench, runs, work)
    print(table(results))
    if args.json:
        head = {"nodes": args.nodes, "steps": args.steps, "remote": args.remote, **settings, "cpus": os.cpu_count()}
        Path(args.json).write_text(json.dumps(head | {"repeats": results}, indent=1))
    return 0


def _start_work(args: argparse.Namespace, prefix: str) -> tuple[Path, dict[str, str], Any]:
    """A work folder, the environment for jobs, and (with --remote s3) a private SeaweedFS; sets
    args.remote_base to where runs are uploaded (a folder or s3:// URL)."""
    if "SLURM_CONF" not in os.environ:
        raise SystemExit('run `eval "$(tools/local-cluster env)"` first')
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["SLURM_TITAN_HOME"] = str(work / "home")  # for status.describe / registry in this process
    env = dict(os.environ)
    server = None
    if args.remote == "s3":
        from tools.local_s3.seaweed import Server, free_port

        server = Server(port=free_port(), data_dir=str(work / "s3"), bucket="slurm-titan-bench").start(
            die_with_parent=True)
        env |= server.env()
        if args.store_cpus is not None:
            pin_threads(server.running_pid(), args.store_cpus)
        args.remote_base = "s3://slurm-titan-bench/runs"
    else:
        args.remote_base = str(work / "remote")
    return work, env, server


def _finish_work(bench: Bench, runs: list[Run], work: Path) -> None:
    bench.cleanup(runs)
    if bench.server is not None:
        bench.server.stop()
    if not bench.args.keep:
        shutil.rmtree(work, ignore_errors=True)
