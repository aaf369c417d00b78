"""Processes as /proc shows them: alive, stopped or gone (a zombie is gone), their program, parent and
namespaces; signal a set of them (children first, when a node is killed) and wait until they stop or are gone.
What the local cluster needs to find and stop its daemons and everything that runs inside its nodes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the program name (which may hold spaces and parentheses): state, ppid, ..."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rpartition(") ")[2].split()


def state(pid: int) -> str | None:
    """PID's state letter as the kernel shows it (R, S, D, T, t, Z, ...), or None when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_running(pid: int) -> bool:
    """PID exists and is not a zombie (PID 1 here may reap orphans a second late)."""
    return state(pid) not in (None, "Z", "X")


def program(pid: int) -> str | None:
    """The program name of PID (/proc/PID/comm), or None when it is gone."""
    try:
        return (PROC / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return None


def namespaces(pid: int) -> str | None:
    """PID's mount and UTS namespaces as one key, "mnt:[N]/uts:[M]" (what tools/local-cluster records per node)."""
    try:
        return f"{os.readlink(PROC / str(pid) / 'ns' / 'mnt')}/{os.readlink(PROC / str(pid) / 'ns' / 'uts')}"
    except OSError:
        return None


@contextlib.contextmanager
def namespaces_held(pids: Iterable[int]) -> Iterator[set[str]]:
    """The namespaces keys (see `namespaces`) of those of `pids` that exist, each namespace held open until the
    block ends. The kernel gives a freed namespace's number to the next namespace made (another cluster's node
    gets the same key at once); an open namespace is not freed, so its key names only its own processes."""
    with contextlib.ExitStack() as held:
        keys = set()
        for pid in pids:
            parts = []
            for kind in ("mnt", "uts"):
                try:
                    fd = os.open(PROC / str(pid) / "ns" / kind, os.O_RDONLY)
                except OSError:
                    break
                held.callback(os.close, fd)
                parts.append(f"{kind}:[{os.fstat(fd).st_ino}]")
            else:
                keys.add("/".join(parts))
        yield keys


def all_pids() -> Iterator[int]:
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def in_namespaces(keys: set[str]) -> list[int]:
    """The running processes whose namespaces key (see `namespaces`) is one of `keys`."""
    if not keys:
        return []
    return [pid for pid in all_pids() if namespaces(pid) in keys and is_running(pid)]


def parent(pid: int) -> int | None:
    """PID's parent, or None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def children(of: int) -> list[int]:
    """The processes whose parent is `of`."""
    return [pid for pid in all_pids() if parent(pid) == of]


def children_first(pids: Iterable[int]) -> list[int]:
    """`pids`, each after every one of its descendants (deepest in the process tree first)."""
    def depth(pid: int) -> int:
        count, seen = 0, {pid}
        while (up := parent(pid)) and up not in seen:
            count, pid = count + 1, up
            seen.add(up)
        return count
    return sorted(pids, key=depth, reverse=True)


def send(pids: Iterable[int], signum: int) -> int:
    """Send `signum` to each of `pids` that still exists; how many got it."""
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            sent += 1
    return sent


def wait_stopped(pids: Iterable[int], seconds: float) -> bool:
    """Wait until each of `pids` is stopped (T) or gone; False on timeout (one in uninterruptible sleep stops
    only once it leaves it)."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while any(state(pid) not in (None, "T", "t", "Z", "X") for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def wait_gone(pids: Iterable[int], seconds: float) -> bool:
    """Wait until none of `pids` runs; False on timeout."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while any(is_running(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
