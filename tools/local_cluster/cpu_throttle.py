"""A slow node made real: a cgroup CPU quota on chosen processes, as a thermally throttled chip or a noisy
neighbour would slow them. cgroup v1's cpu controller (`/sys/fs/cgroup/cpu`: cpu.cfs_quota_us over
cpu.cfs_period_us) or v2's (`cpu.max`); needs root. Shared by the end-to-end tests, the slow-node benchmark
and the integration test of the judge.

    cpus = cpus_when_running([pid], 5.0)   # on a loaded machine: its share while it runs, not a whole CPU
    with CpuThrottle("slurm-titan-slow-n2", cpus=0.6 * cpus) as throttle:
        throttle.add(pid)          # every thread of pid: cgroup.procs moves the whole process

A quota binds only below what the processes get anyway: on a machine shared with other work a process gets a
share of a CPU while it runs, hence the quota as a fraction of that share (`cpus_when_running`). Meant for
processes whose work is one busy thread (the debug model's ranks at OMP_NUM_THREADS=1, the benchmark's).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _schedstat_ns(pid: int) -> tuple[int, int]:
    """Nanoseconds the threads of `pid` ran and waited for a CPU (schedstat, summed); zeros once it is gone."""
    ran = waited = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                on_cpu, run_delay, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                ran, waited = ran + int(on_cpu), waited + int(run_delay)
    return ran, waited


def cpus_when_running(pids: list[int], seconds: float) -> float:
    """The CPUs `pids` get while they want to run, over the next `seconds`: each one's time on a CPU over its time
    on a CPU or waiting for one, summed (1.0: one process that always runs when it wants to)."""
    before = [_schedstat_ns(pid) for pid in pids]
    time.sleep(seconds)
    shares = (_share(then, _schedstat_ns(pid)) for pid, then in zip(pids, before))
    return sum(1.0 if share is None else share for share in shares)


def _share(before: tuple[int, int], now: tuple[int, int]) -> float | None:
    """Time on a CPU over time on a CPU or waiting for one, between two schedstat readings; None when the process
    did not want to run in between."""
    ran = now[0] - before[0]
    wanted = ran + now[1] - before[1]
    return ran / wanted if wanted > 0 else None


class ShareMeter:
    """`cpus_when_running` without the sleep: what processes got while they wanted to run, from one reading of
    theirs to the next."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, int]] = {}

    def read(self, pids: list[int]) -> float | None:
        """The CPUs `pids` got since their last reading, summed; None when none of them wanted to run since."""
        shares = []
        for pid in pids:
            now = _schedstat_ns(pid)
            if (before := self._last.get(pid)) is not None and (share := _share(before, now)) is not None:
                shares.append(share)
            self._last[pid] = now
        return sum(shares) if shares else None


def root() -> Path | None:
    """The cpu controller's root this machine has, None when neither is writable here."""
    for path, marker in ((V1, "cpu.cfs_quota_us"), (V2, "cgroup.controllers")):
        if (path / marker).is_file() and os.access(path, os.W_OK):
            return path
    return None


class CpuThrottle:
    """A cgroup capping its processes, together, at `cpus` CPUs (0.6: 60 % of one CPU)."""

    def __init__(self, name: str, cpus: float, period_us: int = PERIOD_US) -> None:
        base = root()
        if base is None:
            raise RuntimeError("no writable cgroup cpu controller (/sys/fs/cgroup/cpu or cgroup v2): run as root")
        self.v1 = base == V1
        self.path, self.quota_us, self.period_us = base / name, max(1000, int(cpus * period_us)), period_us
        self.parent = base

    def __enter__(self) -> CpuThrottle:
        self.path.mkdir(exist_ok=True)
        if self.v1:
            (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        self.set_cpus(self.quota_us / self.period_us)
        return self

    def set_cpus(self, cpus: float) -> None:
        """A new cap, for the group's processes from now on."""
        self.quota_us = max(1000, int(cpus * self.period_us))
        if self.v1:
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        else:
            (self.path / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]

    def release(self) -> None:
        """Every process back to the root group (full speed); the group stays."""
        for pid in self.pids():
            with contextlib.suppress(OSError):  # it ended meanwhile
                (self.parent / "cgroup.procs").write_text(str(pid))

    def __exit__(self, *exc: object) -> None:
        self.release()
        for _ in range(50):  # rmdir fails while the kernel still counts a process that just left
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
