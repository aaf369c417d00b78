"""Keep the checkpoint upload's threads out of training's way.

Two per-thread settings, which the uploader process applies to its main thread first thing (and
CheckpointSync's own threads to themselves when it runs in-process); on Linux both are per
thread and every thread started afterwards (the transfer pools) inherits them:

- a lower CPU priority (nice), so training keeps the cores it needs;
- optionally CPUs of their own (``checkpoint.upload_cpus``, a CPU list as ``taskset -c`` takes
  it), so the upload never runs on the cores that feed the accelerators.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("slurm_titan.ckpt.background")


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPU numbers of a list such as ``"1"``, ``"0-3,8"`` or ``"48-63,112-127"`` (the format of
    ``taskset -c`` and /sys/devices/system/cpu/online). ValueError (one line) if it is not one."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list (e.g. '1' or '0-3,8')")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"{part!r} in {text!r}: the range runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    """The shortest CPU list for `cpus` (inverse of :func:`parse_cpu_list`)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice` (at most 19); elsewhere than Linux this
    does nothing (a thread id is not a process id there)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        log.warning("cannot lower the priority of thread %s: %s", threading.current_thread().name, e)


def confine_thread(cpus: frozenset[int] | None) -> None:
    """Run the calling thread only on `cpus` (None: leave it where it is). CPUs this job may not
    use (outside its cgroup, offline) make the kernel refuse: one warning, and the thread stays
    on training's CPUs."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(threading.get_native_id(), cpus)
    except OSError as e:
        log.warning("checkpoint.upload_cpus %s cannot be used here (%s): the upload shares training's CPUs",
                    format_cpu_list(cpus), e.strerror or e)


def background_thread(nice: int, cpus: frozenset[int] | None) -> None:
    """What the upload and commit threads call first: lower priority, own CPUs."""
    lower_thread_priority(nice)
    confine_thread(cpus)
