"""Keep background threads out of training's way: the checkpoint upload's, the RAM tier's, a standby step's import.

Two per-thread settings, which the uploader process applies to its main thread first thing (and
CheckpointSync's own threads to themselves when it runs in-process); on Linux both are per
thread and every thread started afterwards (the transfer pools) inherits them:

- a lower CPU priority (nice), so training keeps the cores it needs;
- optionally CPUs of their own (``checkpoint.upload_cpus``, a CPU list as ``taskset -c`` takes
  it: :mod:`slurm_titan.cpulist`), so the upload never runs on the cores that feed the accelerators.

A thread's nice counts only against the threads of its own session where the kernel groups sessions
(:data:`SESSION_GROUP`); a standby step, a session apart from the training it waits beside, lowers its whole
session instead (:func:`lower_session_priority`), and its ranks leave it once adopted (:func:`take_own_session`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from slurm_titan.cpulist import format_cpu_list

log = logging.getLogger("slurm_titan.thread_priority")
BACKGROUND_NICE = 19
"""The nice value of work that is not to take the CPU training wants: the RAM tier's (a rank's write of its snapshot,
a node's copy to its partner and its receipt of the partner's) and a standby step's import
(:mod:`slurm_titan.rank.entry`). Sustained work at nice 19 gets ~1% of a CPU that training keeps busy (a standby's
import runs mostly in what training leaves idle); a burst after a sleep still runs at once: over a 20-minute soak a
snapshot's copies cost the next step about as much as at nice 0, less in 4-minute runs (docs/measurements.md).
Restores run at training's priority."""


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


SESSION_GROUP = "/proc/self/autogroup"
"""Linux's scheduling autogroup of the calling process's session: with `kernel.sched_autogroup_enabled` (Debian's
default) the kernel shares the CPU between sessions first and by their threads' nice only within one, and every
srun task starts a session of its own (slurmstepd), so a thread's nice counts only against its own node step's
threads. A standby step's import at nice 19 took as much CPU from the training steps beside it as at nice 0."""


def lower_session_priority(nice: int) -> bool:
    """Give the calling process's session (its scheduling autogroup: a standby step's supervisor and its ranks) the
    nice value `nice` against the other sessions; False where the kernel has no autogroups or refuses."""
    try:
        with open(SESSION_GROUP, "w") as group:
            group.write(str(nice))
        return True
    except OSError as e:
        log.debug("the session's scheduling group keeps its priority: %s", e)
        return False


def take_own_session() -> bool:
    """Leave the session the calling process was started in for one of its own (os.setsid): with autogroups, a new
    group at nice 0, away from one that :func:`lower_session_priority` lowered; False for a process that leads a
    process group, which cannot and stays (a rank started by its supervisor does not lead one)."""
    try:
        os.setsid()
        return True
    except OSError as e:
        log.warning("cannot start a session of its own (%s): the process keeps its session's priority", e)
        return False


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
