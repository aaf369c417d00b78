"""The Slurm part of the scale harness (issue 24): probe rounds, step creation and status queries at N simulated
ranks (M = N // 8 nodes) against the Slurm shims of :mod:`.slurm_shims`, and hang attribution with one node's clock
5 s off (:mod:`.hangs`). The project's code runs as it is (in this process, a node supervisor a thread); only
Slurm is simulated.

    .venv/bin/python -m tools.bench.scale_sim --parts slurm --ranks 64 128 256 512

A row's scenarios, each with its own shim state (creation 0.1 s a step, a dead node's launch failing after 10 s):

- node lost: node M/2 dies, the others' ranks crash and their nodes report; the batch shell's watcher
  (``step_watch.watch``, beside a stand-in srun step) and every surviving supervisor's batch-host check
  (``batch_host.requeue_if_batch_shell_gone``) run, then ``finish.blame``: its sruns, Slurm queries, the node blamed;
- batch host lost: node 0 (the batch host: no watcher) dies; every surviving supervisor's check, 10 s after its
  ranks failed with no heartbeat since (one claims it, the others wait for its outcome): the sruns and how many fly
  at once, the Slurm queries, the requeue;
- slow step creation: the last node's ranks crash and it reports, the others live but stay silent until the
  watcher's probe of them ends; step creation takes 40 s: no healthy node may be named lost;
- queries: 32 jobs in the registry (16 slurmctld still knows, 16 only accounting): ``slurm-titan status``,
  ``runs --limit 32`` and ``logs -f`` of a running job that ends 3 s later, as real processes: each one's Slurm
  queries (``logs -f``: of each state check, queries less than a second apart making one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from slurm_titan.node.batch import attribution, finish, step_watch
from slurm_titan.node.batch.outcome import RESTART, Outcome
from slurm_titan.node.supervisor import batch_host
from slurm_titan.records import jobs as registry
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from tools.bench.scale_sim import hangs, slurm_shims
from tools.bench.scale_sim.goals import Goal
from tools.bench.scale_sim.slurm_shims import Call, Cluster, Job, most_in_flight, read_calls, starts

JOB_ID = "1000"
JOBS = 32
QUERIES = ("scontrol", "sacct", "squeue")
CHECK_GAP_S = 1.0

GOALS = (
    Goal("Slurm: probe rounds (sruns) per failure", "sruns_per_failure", 1, kind="every"),
    Goal("Slurm: sruns in flight at once", "sruns_in_flight", 16, kind="every"),
    Goal("Slurm: healthy nodes marked lost (one scenario: step creation 40 s)", "healthy_lost", 0, kind="every"),
    Goal(f"status: Slurm queries over {JOBS} jobs", "status_queries", 2, kind="every"),
    Goal(f"runs: Slurm queries over {JOBS} jobs", "runs_queries", 2, kind="every"),
    Goal("logs -f: Slurm queries per state check", "logs_queries_per_check", 2, kind="every"),
    Goal("a hang names the stuck rank with one node's clock 5 s off (by stacks, steps or a tie)", "culprit_right", 1,
         kind="every", most=False),
)


@dataclass(frozen=True)
class Timing:
    """The simulated Slurm's delays, and how long `logs -f` follows a running job."""

    creation_s: float  # slurmctld's time to create a step
    slow_creation_s: float  # the same, in the slow step creation scenario
    launch_fail_s: float  # srun's time to give up a node whose slurmd does not answer (MessageTimeout)
    follow_s: float


BENCH = Timing(creation_s=0.1, slow_creation_s=40.0, launch_fail_s=10.0, follow_s=3.0)
QUICK = Timing(creation_s=0.05, slow_creation_s=1.0, launch_fail_s=0.5, follow_s=0.0)
"""A small row for the tests: the same scenarios, short delays."""


@dataclass(frozen=True)
class Sim:
    """One row's simulated cluster: its folder (the shims in bin/), nodes and delays."""

    root: Path
    hosts: list[str]
    timing: Timing
    path: str  # PATH without the shims

    def scenario(self, name: str, dead: list[str]) -> tuple[Path, Path]:
        """A scenario's job folder (its attempt's folder made) and shim state (the running job, `dead` nodes)."""
        job_dir, state = self.root / name / "job", self.root / name / "slurm"
        run_folder.attempt_folder(job_dir, hangs.ATTEMPT).mkdir(parents=True)
        Cluster(JOB_ID, dead, [Job(JOB_ID, "RUNNING", self.hosts, self.hosts[0])]).write(state)
        return job_dir, state

    def env(self, state: Path, creation_s: float | None = None) -> dict[str, str]:
        return slurm_shims.environment(self.root / "bin", self.path, state,
                                       self.timing.creation_s if creation_s is None else creation_s,
                                       self.timing.launch_fail_s)


@dataclass(frozen=True)
class Round:
    """What a failure scenario cost and concluded: `right` when it blamed (or requeued for) the right node."""

    sruns: int
    in_flight: int
    queries: int
    healthy_lost: int
    right: bool


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _shims(sim: Sim, state: Path, creation_s: float | None = None) -> Iterator[None]:
    """Slurm's shims in this process's environment, and the batch shell's output in the scenario's log."""
    with _environ(sim.env(state, creation_s)), (state / "batch-shell.log").open("w") as log, \
            redirect_stdout(log), redirect_stderr(log):
        yield


@contextmanager
def _srun_step() -> Iterator[subprocess.Popen[bytes]]:
    """The attempt's srun step as the batch shell's watcher sees it: a process that runs until killed."""
    step = subprocess.Popen(["sleep", "3600"])
    try:
        yield step
    finally:
        step.kill()
        step.wait()


@contextmanager
def _supervisors(job_dir: Path, hosts: list[str], failed_s_ago: float = 0.0) -> Iterator[list[Future[str | None]]]:
    """Every surviving node supervisor's check of the batch host after its ranks failed `failed_s_ago` (the
    heartbeat then as now; the job's nodes: `hosts` and the one lost): a thread each; each future is the batch host
    it requeued the job for (None: it did not)."""
    with HeldFolder(run_folder.attempt_folder(job_dir, hangs.ATTEMPT)) as attempt_dir, \
            ThreadPoolExecutor(len(hosts)) as pool:
        now = batch_host.mark_beat(attempt_dir)
        failed = batch_host.BeatMark(now.mtime, now.seen_at - failed_s_ago)
        yield [pool.submit(batch_host.requeue_if_batch_shell_gone, attempt_dir, JOB_ID, failed, host, len(hosts) + 1)
               for host in hosts]


def _requeued(checks: list[Future[str | None]]) -> set[str]:
    return {host for check in checks if (host := check.result())}


def _crash(node: int, at: float) -> dict:
    return {"rank": node * hangs.RANKS_PER_NODE, "exit_code": 1, "time": at}


def _blame(job_dir: Path, hosts: list[str]) -> attribution.NodeFailure | None:
    """The batch shell's blame of the failed attempt (`finish`, about to restart in the allocation)."""
    env = {"SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "sim", "SLURM_JOB_NODELIST": ",".join(hosts),
           "SLURM_CLUSTER_NAME": "scale-sim"}
    reports = attribution.read_reports(job_dir, hangs.ATTEMPT, len(hosts))
    return finish.blame(job_dir, JOB_ID, finish.Attempt(hangs.ATTEMPT, hosts), Outcome("failed", RESTART), env,
                        reports, progressed=True)[0]


def _lost(failure: attribution.NodeFailure | None) -> set[str]:
    return {failure.host} if failure is not None and failure.kind == attribution.LOST else set()


def _round(state: Path, named_lost: set[str], dead: set[str], right: bool) -> Round:
    calls = read_calls(state)
    return Round(starts(calls, "srun"), most_in_flight(calls, "srun"), starts(calls, *QUERIES),
                 len(named_lost - dead), right)


def node_lost(sim: Sim) -> Round:
    """Node M/2 dies; the others report their ranks' crash. `right`: it is blamed, lost."""
    dead = sim.hosts[len(sim.hosts) // 2]
    job_dir, state = sim.scenario("node-lost", [dead])
    failed_at = time.time()
    for node, host in enumerate(sim.hosts):
        if host != dead:
            hangs.node_report(job_dir, node, host, 1, _crash(node, failed_at))
    survivors = [host for host in sim.hosts if host != dead]
    with _shims(sim, state), _srun_step() as step, _supervisors(job_dir, survivors) as checks:
        lost = set(step_watch.watch(job_dir, hangs.ATTEMPT, sim.hosts, step.pid))
        failure = _blame(job_dir, sim.hosts)
    requeued = _requeued(checks)
    return _round(state, lost | _lost(failure) | requeued, {dead}, _lost(failure) == {dead} and not requeued)


def batch_host_lost(sim: Sim) -> Round:
    """Node 0, the batch host, dies. `right`: the job is requeued for it, once."""
    dead = sim.hosts[0]
    job_dir, state = sim.scenario("batch-host-lost", [dead])
    # they waited for a heartbeat that did not come
    with _shims(sim, state), _supervisors(job_dir, sim.hosts[1:], batch_host.BEAT_STALE_S) as checks:
        requeued = _requeued(checks)
    return _round(state, requeued, {dead}, requeued == {dead})


def _report_after_probe(job_dir: Path, state: Path, hosts: list[str], step: subprocess.Popen[bytes]) -> None:
    """The silent nodes report (their ranks failed on the crash, late) once the watcher's probe has ended, and the
    attempt's step ends."""
    while step.poll() is None and not any(c.cmd == "srun" and c.event == "end" for c in read_calls(state)):
        time.sleep(0.2)
    for node, host in enumerate(hosts):
        hangs.node_report(job_dir, node, host, 1, _crash(node, time.time()))
    step.kill()


def slow_creation(sim: Sim) -> Round:
    """The last node's ranks crash and it reports; the others live, silent until the watcher's probe of them ends,
    whose step takes `slow_creation_s` to create. `right`: the crash is blamed, on the last node."""
    crashed = len(sim.hosts) - 1
    job_dir, state = sim.scenario("slow-creation", [])
    hangs.node_report(job_dir, crashed, sim.hosts[crashed], 1, _crash(crashed, time.time()))
    with _shims(sim, state, sim.timing.slow_creation_s), _srun_step() as step:
        late = threading.Thread(target=_report_after_probe, args=(job_dir, state, sim.hosts[:crashed], step))
        late.start()
        lost = set(step_watch.watch(job_dir, hangs.ATTEMPT, sim.hosts, step.pid))
        late.join()
        failure = _blame(job_dir, sim.hosts)
    right = failure is not None and failure.kind == attribution.CRASHED and failure.host == sim.hosts[crashed]
    return _round(state, lost | _lost(failure), set(), right)


def _cli(env: dict[str, str], *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", *args], env=env, cwd=slurm_shims.REPO,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"slurm-titan {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")


def _queries_of(state: Path, env: dict[str, str], *args: str) -> list[Call]:
    """The Slurm queries of one `slurm-titan` command."""
    before = len(read_calls(state))
    _cli(env, *args)
    return [call for call in read_calls(state)[before:] if call.event == "start" and call.cmd in QUERIES]


def _per_check(queries: list[Call]) -> list[int]:
    """The queries of each state check: those less than CHECK_GAP_S apart make one."""
    checks: list[int] = []
    last = float("-inf")
    for call in sorted(queries, key=lambda c: c.t):
        if call.t - last > CHECK_GAP_S:
            checks.append(0)
        checks[-1] += 1
        last = call.t
    return checks or [0]


def _registered(sim: Sim, index: int) -> Job:
    """Job `index` of the registry (its record and empty folder), as Slurm knows it: the first half by slurmctld
    (the first one running), the rest by accounting only."""
    job_id = str(2000 + index)
    folder = sim.root / "runs" / f"sim-{index}" / job_id
    folder.mkdir(parents=True)
    registry.save(registry.new_record(job_id, f"sim-{index}", folder, "sim.yaml", len(sim.hosts)))
    if index < JOBS // 2:
        return Job(job_id, ("RUNNING", "PENDING", "COMPLETED")[index % 3], sim.hosts, sim.hosts[0])
    return Job(job_id, ("COMPLETED", "FAILED")[index % 2], sim.hosts, sim.hosts[0], forgotten=True)


def queries(sim: Sim) -> dict[str, float]:
    """`status`, `runs` and `logs -f` over the registry's JOBS jobs: their Slurm queries."""
    state = sim.root / "queries"
    known = [_registered(sim, index) for index in range(JOBS)]
    Cluster(JOB_ID, [], known).write(state)
    env = dict(os.environ) | sim.env(state)
    status = _queries_of(state, env, "status", "--json")
    runs = _queries_of(state, env, "runs", "--limit", str(JOBS), "--json")
    known[0].ends_at = time.time() + sim.timing.follow_s
    Cluster(JOB_ID, [], known).write(state)
    follow = _per_check(_queries_of(state, env, "logs", "-f", known[0].id))
    return {"status_queries": len(status), "runs_queries": len(runs), "logs_queries_per_check": max(follow),
            "logs_checks": len(follow)}


def row(ranks: int, workdir: Path, timing: Timing) -> dict[str, float]:
    """Every scenario at `ranks` simulated ranks, with `timing`'s delays."""
    nodes = ranks // hangs.RANKS_PER_NODE
    root = workdir / f"ranks-{ranks}"
    slurm_shims.install(root / "bin")
    sim = Sim(root, hangs.host_names(nodes), timing, os.environ["PATH"])
    with _environ({"SLURM_TITAN_HOME": str(root / "home")}):
        lost, host, slow = node_lost(sim), batch_host_lost(sim), slow_creation(sim)
        figures = queries(sim) | hangs.figures(root / "hangs", nodes)
    rounds = (lost, host, slow)
    return {"ranks": float(ranks), "nodes": float(nodes), "sruns_per_failure": max(lost.sruns, host.sruns),
            "sruns_node_lost": lost.sruns, "sruns_batch_host_lost": host.sruns,
            "sruns_in_flight": max(r.in_flight for r in rounds), "healthy_lost": sum(r.healthy_lost for r in rounds),
            "queries_node_lost": lost.queries, "queries_batch_host_lost": host.queries,
            "dead_node_blamed": float(lost.right),
            "batch_host_requeued": float(host.right), "slow_crash_blamed": float(slow.right)} | figures


def measure(ranks: int, workdir: Path) -> dict[str, float]:
    """One row of the bench: :data:`BENCH`'s delays (step creation 40 s in its slow scenario)."""
    return row(ranks, workdir, BENCH)
