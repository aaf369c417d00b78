"""A process's "wanted" CPU time: what its threads ran plus what they waited on a run queue (Linux schedstat).

`/proc/<pid>/task/<tid>/schedstat` holds three numbers per thread: nanoseconds on a CPU, nanoseconds runnable
but waiting for one (run_delay), and time slices. Their first two summed are the time the thread wanted to
run. In synchronous training this separates working from waiting: a rank blocked in a collective (gloo's
waits block, they do not spin) wants nothing, while a rank throttled by a CPU quota, a noisy neighbour or
a slow host runs less but waits on the run queue instead, so its wanted time per step grows with its
slowdown. CPU time alone cannot tell the two apart: the healthy rank sleeps in the collective while the
slow one is denied the CPU, and both show the same CPU/wall ratio.

Threads come and go (data loading, DCP's save threads): :class:`WantedTime` keeps each live thread's last
reading and adds only what each thread gained since, so that a thread that ended never makes the sum go
back (its last, unread slice is lost: microseconds).
"""

from __future__ import annotations

import os

NS = 1e-9


def thread_wanted_ns(task_dir: str) -> dict[int, int]:
    """Each live thread's on-CPU + run-queue nanoseconds under `task_dir` (`/proc/<pid>/task`)."""
    wanted = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return {}
    for tid in tids:
        try:  # os-level calls: a Python file object costs several times more, and this runs every step
            fd = os.open(f"{task_dir}/{tid}/schedstat", os.O_RDONLY)
            try:
                on_cpu, run_delay, _ = os.read(fd, 128).split()
            finally:
                os.close(fd)
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        wanted[int(tid)] = int(on_cpu) + int(run_delay)
    return wanted


class WantedTime:
    """The wanted CPU time of process `pid` (default: this one) summed over its threads, as it grows."""

    def __init__(self, pid: int | str = "self") -> None:
        self._task_dir = f"/proc/{pid}/task"
        self._last: dict[int, int] = {}
        self._total_ns = 0
        self.sample()

    def sample(self) -> float:
        """Seconds wanted since this object was made (every thread's gain since the last sample, summed)."""
        now = thread_wanted_ns(self._task_dir)
        self._total_ns += sum(max(0, value - self._last.get(tid, 0)) for tid, value in now.items())
        self._last = now
        return self._total_ns * NS
