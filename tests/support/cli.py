"""Drive the real `slurm-titan` command: `run` a command, `wait_for` a condition, `Cli` against the bundled
Slurm cluster and a real S3 store (fixture `cli`), `PROBE` (a CLI run that reports the heavy modules it
imported). As a plugin it also shows, for a failed test, the log tails of the jobs it submitted and what Slurm's
daemons logged about them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.s3 import S3Server
from tests.support.throttle import ThrottledS3
from tools.local_cluster.cluster import LocalCluster
from tools.local_cluster.faults import PacedRanks

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SUBMITTED: list[tuple[Path, str]] = []  # (runs folder, job id) of every job the tests submitted, in order
FIRST_JOB = pytest.StashKey[int]()
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROBE = """
import sys, runpy
sys.argv = ["slurm-titan", *{args!r}]
try:
    runpy.run_module("slurm_titan.cli.main", run_name="__main__")
except SystemExit as done:
    code = done.code
heavy = sorted(m for m in ("torch", "torchtitan", "torch_npu", "tokenizers") if m in sys.modules)
print("HEAVY:", ",".join(heavy), file=sys.stderr)
"""


def run(args: list[Any], env: dict | None = None, timeout: float = 60, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], env=env, timeout=timeout, text=True, capture_output=True,
                            cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def slurm_state(job_id: str, env: dict) -> str | None:
    """Slurm's JobState of `job_id` (RUNNING, COMPLETED, ...), None once the controller no longer knows it."""
    found = re.search(r"\bJobState=(\S+)", run(["scontrol", "-o", "show", "job", job_id], env=env, check=False).stdout)
    return found.group(1) if found else None


PACE_CPUS = 0.1
"""A paced job's ranks each train at <= this many CPUs (`Cli.submit(paced=True)`): the small batch's step, 0.23
CPU-seconds on the 2-core machine (tests.support.configs) and about 0.1 on the faster machines of earlier
sessions (scaled from 2 x 128 tokens' 0.15 there, not measured), takes >= 1 s on any machine."""


class Cli:
    """Runs the real `slurm-titan` command against the local cluster and a real S3 store, with a
    private job registry and runs folder; `submit` gives every job its own remote location."""

    def __init__(self, env: dict, home: Path, s3: S3Server | ThrottledS3) -> None:
        self.env = env | s3.env() | {"SLURM_TITAN_HOME": str(home)}
        self.store = s3  # the store `remote` is in (a test may point `env` elsewhere)
        self.kept: set[str] = set()  # jobs whose checkpoints later tests read (`remove_checkpoints` leaves them)
        self.runs = home / "runs"
        self.remote = s3.url("runs/{name}/{job_id}")
        self.pacers: list[PacedRanks] = []
        self._job_dirs: dict[str, Path] = {}

    def __call__(self, *args: Any, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return run([sys.executable, "-m", "slurm_titan.cli.main", *args], env=self.env, check=check, timeout=timeout,
                   cwd=REPO)

    def submit(self, *args: Any, paced: bool = False, pace_cpus: float = PACE_CPUS) -> str:
        """Submit the job; `paced`: its ranks train at `pace_cpus` each (tools.local_cluster.faults.PacedRanks)
        until `close`: a fault meant to land mid-run does, on any machine, and a run of many steps costs the CPU
        of their work only."""
        defaults = ["--set", f"runs_dir={self.runs}", "--set", f"checkpoint.remote={self.remote}"]
        out = self("submit", *defaults, *args).stdout
        match = re.search(r"submitted job (\d+)", out)
        assert match, out
        job = match.group(1)
        SUBMITTED.append((self.runs, job))
        if paced:
            self.pacers.append(PacedRanks(self.job_dir(job), job, pace_cpus).__enter__())
        return job

    def close(self) -> None:
        """Stop pacing the paced jobs (their cgroups removed); cancel the jobs still running and delete what they
        wrote to the nodes' disks and the store (`remove_checkpoints`)."""
        for pacer in self.pacers:
            pacer.__exit__()
        self.pacers.clear()
        self.remove_checkpoints()

    def jobs(self) -> set[str]:
        """Every job of this Cli's runs: those it submitted and those their runs submitted themselves."""
        return {folder.name for folder in self.runs.glob("*/*") if folder.name.isdigit()}

    def remove_checkpoints(self) -> None:
        """Cancel this Cli's jobs still running, then delete their node-local folders and their remote folders,
        and the copies a test made of them or of a kept job's (`<remote>-from10`); the kept jobs' own stay. The
        suite's disk use stays that of the tests running, not of all it ran (~77 MB a step of the debug model);
        the job folders and logs stay."""
        import s3fs  # here: the plugin loads in every session, unit tests' too

        jobs = self.jobs() - self.kept
        if not jobs | self.kept:
            return
        def queued() -> set[str]:
            return jobs & set(run(["squeue", "-h", "-o", "%A"], env=self.env).stdout.split())

        if jobs and queued():
            run(["scancel", *sorted(jobs)], env=self.env, check=False)
            wait_for(lambda: not queued(), 120, f"jobs {sorted(jobs)} to end")
        for folder in (LocalCluster.from_env(self.env).state / "nodes").glob("*/scratch/*/*"):
            if folder.name.split("-")[0] in jobs:
                shutil.rmtree(folder, ignore_errors=True)
        store = s3fs.S3FileSystem(**self.store.storage_options(), skip_instance_cache=True)
        runs = self.remote.removeprefix("s3://").split("/{name}/")[0]
        gone = []
        for folder in store.glob(f"{runs}/*/*"):
            job, _, copy = folder.rsplit("/", 1)[-1].partition("-")
            if job in jobs or (job in self.kept and copy):
                gone.append(folder)
        if gone:
            store.rm(gone, recursive=True)
            self.store.vacuum()

    def __enter__(self) -> Cli:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self, job_id: str) -> dict:
        return json.loads(self("status", job_id, "--json").stdout)

    def job_dir(self, job_id: str) -> Path:
        """The job's folder, asked of `status` once (a job's folder never moves)."""
        if job_id not in self._job_dirs:
            self._job_dirs[job_id] = Path(self.status(job_id)["job_dir"])
        return self._job_dirs[job_id]

    def wait(self, job_id: str, timeout: float = 600) -> dict:
        """The job's status once it finished. Slurm's state is polled with scontrol (a C program, ~100x less CPU
        than a `slurm-titan status` run); the status is asked for once Slurm says finished or forgot the job."""
        def finished() -> dict | None:
            if slurm_state(job_id, self.env) not in FINISHED | {None}:
                return None
            status = self.status(job_id)
            return status if status["state"] in FINISHED else None

        return wait_for(finished, timeout, f"job {job_id} to finish", interval=2)


@pytest.fixture
def cli(slurm_env: dict, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    cli = Cli(slurm_env, tmp_path_factory.mktemp("slurm-titan-home"), s3_server)
    yield cli
    cli.close()


def log_tails(jobs: list[tuple[Path, str]]) -> str:
    """The last lines of every node and rank log of `jobs`: what a failed end-to-end test shows."""
    parts = []
    for runs, job in jobs:
        for folder in runs.glob(f"*/{job}"):
            logs = [(log, 40) for log in sorted(folder.glob(f"{job}_*_log.out"))]
            for log, lines in logs + [(log, 12) for log in sorted(folder.glob("logs/rank-*.log"))]:
                tail = ANSI.sub("", log.read_text(errors="replace")).splitlines()[-lines:]
                parts.append(f"--- {log} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


def slurm_log_lines(jobs: list[tuple[Path, str]], lines: int = 30) -> str:
    """The last lines of the bundled cluster's daemon logs that name one of `jobs` (what Slurm did to them)."""
    ids = [job for _, job in jobs]
    parts = []
    for log in sorted(LocalCluster.from_env().logs.glob("slurm*.log")):
        named = [line for line in log.read_text(errors="replace").splitlines() if any(job in line for job in ids)]
        if named:
            tail = named[-lines:]
            parts.append(f"--- {log} (last {len(tail)} lines naming the jobs)\n" + "\n".join(tail))
    return "\n".join(parts)


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[FIRST_JOB] = len(SUBMITTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test that submitted jobs shows their logs' tails (CI keeps nothing else)."""
    report = (yield).get_result()
    jobs = SUBMITTED[item.stash.get(FIRST_JOB, len(SUBMITTED)):]
    if report.failed and jobs:
        report.sections.append(("slurm-titan job logs", log_tails(jobs)))
        report.sections.append(("Slurm's logs of the jobs", slurm_log_lines(jobs)))
