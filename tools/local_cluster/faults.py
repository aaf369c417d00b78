"""Real faults for jobs on the bundled cluster, injected from outside as an operator or the hardware would:
a signal to a training process once its own log shows a step (SIGKILL: a crash; SIGSTOP: a hang), or a CPU
quota on a node's training processes (a slow node: ThrottleAtStep), or on every rank of a job (a slower
machine, the same for all: PacedRanks). A node killed whole is `LocalCluster.kill_node` (cluster.py). Shared
by the end-to-end tests and tools/bench/fault_recovery.py."""

from __future__ import annotations

import abc
import contextlib
import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurm_titan.envvars import ATTEMPT_INDEX
from tools.local_cluster.cpu_throttle import CpuThrottle, ShareMeter, cpus_when_running, root


def rank_processes(job_id: str) -> dict[int, dict[str, str]]:
    """The job's live training processes on this machine (every local node): pid -> their environment. Each rank's
    of its oldest live attempt only: a later attempt's step started ahead (a standby step, node.batch.ahead) has
    ranks of the same number, which wait at their start gate and share the rank's log, until the attempt before
    theirs ended."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"slurm_titan.rank.entry" not in (entry / "cmdline").read_bytes():
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text(errors="replace").split("\0")
                       if "=" in item)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job_id:
            found[int(entry.name)] = env
    oldest: dict[str | None, int] = {}
    for env in found.values():
        oldest[env.get("RANK")] = min(_attempt(env), oldest.get(env.get("RANK"), _attempt(env)))
    return {pid: env for pid, env in found.items() if _attempt(env) == oldest[env.get("RANK")]}


def _attempt(env: dict[str, str]) -> int:
    return int(env.get(ATTEMPT_INDEX) or 0)


SCAN_S = 0.1  # how often SignalAtStep searches /proc for new training processes (~1.3 ms a search)
Ready = Callable[[dict[str, str], str], bool]
"""When to strike a process: from its environment and its rank log's text since it started."""


ANY_STEP = re.compile(r"step:\s*\d+\s")


def step_reached(step: int) -> Ready:
    """The rank log shows training step `step` (since the process started)."""
    pattern = re.compile(rf"step:\s*{step}\s")
    return lambda env, text: bool(pattern.search(text))


class AtStep(abc.ABC):
    """Watch every training process of `job_id` (of this attempt and of every later one) whose environment
    matches `match` (e.g. {"RANK": "1"} or {"SLURMD_NODENAME": "n2"}) and `strike(pid, its environment)` each
    once `ready(its environment, its rank log's text since it started)` holds, up to `times` strikes. Use as a
    context manager; subclasses say what a strike is."""

    def __init__(self, job_dir: Path, job_id: str, match: dict[str, str], ready: Ready, times: int = 100,
                 poll_s: float = 0.05) -> None:
        self.job_dir, self.job_id, self.match, self.ready = job_dir, job_id, match, ready
        self.left, self.poll_s = times, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @abc.abstractmethod
    def strike(self, pid: int, env: dict[str, str]) -> None:
        """Act on process `pid`; ProcessLookupError or FileNotFoundError when it is gone (not counted)."""

    def __enter__(self) -> AtStep:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        targets: dict[int, dict[str, str]] = {}  # matching processes not yet struck: pid -> environment
        logs: dict[int, tuple[int, str]] = {}  # pid -> (bytes of its rank log read, its text since first seen)
        done: set[int] = set()
        next_scan = 0.0
        while not self._stop.wait(self.poll_s) and self.left > 0:
            if time.monotonic() >= next_scan:  # /proc is searched less often than `ready` is asked
                next_scan = time.monotonic() + SCAN_S
                targets = {pid: env for pid, env in rank_processes(self.job_id).items()
                           if pid not in done and all(env.get(key) == value for key, value in self.match.items())}
            for pid, env in list(targets.items()):
                log = self.job_dir / "logs" / f"rank-{env['RANK']}.log"
                read, text = logs[pid] if pid in logs else (_size(log), "")
                with contextlib.suppress(OSError), open(log, "rb") as file:
                    file.seek(read)
                    new = file.read()
                    read, text = read + len(new), text + new.decode(errors="replace")
                logs[pid] = read, text
                if self.ready(env, text):
                    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                        self.strike(pid, env)
                        self.left -= 1
                    done.add(pid)  # once per process
                    del targets[pid]


class SignalAtStep(AtStep):
    """Send `signum` to each matching training process once it is ready (AtStep). `signalled` lists each
    target's environment, `times_sent` when."""

    def __init__(self, job_dir: Path, job_id: str, match: dict[str, str], ready: Ready,
                 signum: int = signal.SIGKILL, times: int = 100, poll_s: float = 0.05) -> None:
        super().__init__(job_dir, job_id, match, ready, times, poll_s)
        self.signum = signum
        self.signalled: list[dict[str, str]] = []
        self.times_sent: list[float] = []

    def strike(self, pid: int, env: dict[str, str]) -> None:
        os.kill(pid, self.signum)
        self.signalled.append(env)
        self.times_sent.append(time.time())


class PacedRanks(AtStep):
    """A slower machine for a whole job: each training process of `job_id`, of every attempt, goes into its rank's
    cgroup, capped at `cpus` CPUs, once it logged its first step (its start-up and restore run at full speed).
    The same pace for every rank, so no node is slower than another; a step's wall time is then at least its CPU
    work over `cpus` however fast or idle the machine, and the job burns no more CPU than that work. The cgroups
    are removed on exit."""

    def __init__(self, job_dir: Path, job_id: str, cpus: float) -> None:
        if root() is None:
            raise RuntimeError("pacing a job needs a writable cgroup cpu controller (/sys/fs/cgroup/cpu): run as root")
        super().__init__(job_dir, job_id, {}, lambda env, text: bool(ANY_STEP.search(text)), times=1_000_000,
                         poll_s=0.2)
        self.cpus = cpus
        self.throttles: dict[str, CpuThrottle] = {}  # by rank: a rank's process of a later attempt joins its group

    def strike(self, pid: int, env: dict[str, str]) -> None:
        rank = env["RANK"]
        if rank not in self.throttles:
            self.throttles[rank] = CpuThrottle(f"slurm-titan-pace-{self.job_id}-{rank}", self.cpus).__enter__()
        self.throttles[rank].add(pid)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for throttle in self.throttles.values():
            throttle.__exit__()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class ThrottleAtStep:
    """Slow a node down as a throttled chip would: once its rank `rank`'s log shows step `step`, every training
    process of `job_id` on `host` goes into one cgroup capped at `fraction` of the CPUs they were using
    (measured over `measure_s`: tools/local_cluster/cpu_throttle.py; needs root), then every `steer_s` at
    `fraction` of what another node's processes got while they ran (the median node): on a machine shared with
    other work (other test workers) what a process gets comes and goes with that work, and a quota fixed once
    binds only while the work is light. The node's processes of later attempts join it too. `throttled_at` is
    when the quota took hold, `pids` the processes it holds; the cgroup is removed on exit. Use as a context
    manager."""

    def __init__(self, job_dir: Path, job_id: str, host: str, rank: int, step: int, fraction: float = 0.6,
                 measure_s: float = 3.0, poll_s: float = 0.2, steer_s: float = 2.0) -> None:
        self.job_dir, self.job_id, self.host, self.rank, self.step = job_dir, job_id, host, rank, step
        self.fraction, self.measure_s, self.poll_s, self.steer_s = fraction, measure_s, poll_s, steer_s
        self.throttled_at: float | None = None
        self.cpus: float | None = None
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._throttle: CpuThrottle | None = None

    def __enter__(self) -> ThrottleAtStep:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._throttle is not None:
            self._throttle.__exit__()

    def _node_ranks(self) -> list[int]:
        return [pid for pid, env in rank_processes(self.job_id).items() if env.get("SLURMD_NODENAME") == self.host]

    def _watch(self) -> None:
        reached = step_reached(self.step)
        log = self.job_dir / "logs" / f"rank-{self.rank}.log"
        while not self._stop.wait(self.poll_s) and self._throttle is None:
            with contextlib.suppress(OSError):
                if reached({}, log.read_text(errors="replace")):
                    pids = self._node_ranks()
                    self.cpus = cpus_when_running(pids, self.measure_s)
                    self._throttle = CpuThrottle(f"slurm-titan-slow-{self.job_id}", self.fraction * self.cpus)
                    self._throttle.__enter__()
                    self.throttled_at = time.time()
        meter, steered = ShareMeter(), time.monotonic()
        while not self._stop.wait(self.poll_s):  # this node's processes of later attempts too
            hosts: dict[str, list[int]] = {}
            for pid, env in rank_processes(self.job_id).items():
                hosts.setdefault(env.get("SLURMD_NODENAME", ""), []).append(pid)
            for pid in set(hosts.pop(self.host, [])) - self.pids:
                with contextlib.suppress(OSError):
                    self._throttle.add(pid)  # type: ignore[union-attr]
                    self.pids.add(pid)
            if time.monotonic() - steered >= self.steer_s:
                steered = time.monotonic()
                others = [got for pids in hosts.values() if (got := meter.read(pids)) is not None]
                if others:
                    self._throttle.set_cpus(self.fraction * statistics.median(others))  # type: ignore[union-attr]
