"""Waiting for a process to end without polling it: a pidfd (Linux 5.3+) becomes readable as the process exits, so a
supervisor hears of a rank's exit, and the batch shell of its srun step's, at once instead of at its next poll
(0.5-1 s, on the path from every fault to the next trained step). Where pidfds are missing (an older kernel, another
system) the wait is the plain sleep it replaces."""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Iterable


def wait_for_exit(pids: Iterable[int], timeout_s: float | None) -> bool:
    """Wait until one of ``pids`` has ended (or is no more), at most ``timeout_s`` (None: for as long as it takes);
    True when one has. With no pids, or without pidfds, it sleeps ``timeout_s`` and returns False (None: at once)."""
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return True
        if fds:
            readable, _, _ = select.select(fds, [], [], timeout_s)
            return bool(readable)
    except (AttributeError, OSError):  # no os.pidfd_open, or a kernel without the call
        pass
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    if timeout_s is not None:
        time.sleep(timeout_s)
    return False
