"""A node supervisor's presence on its node, for the next attempt's step waiting beside it (node.batch.ahead).

Each supervisor binds an abstract Unix socket named after its job folder, attempt and node for as long as it lives;
the kernel removes the name with the process, so nothing is left on the node however it ends. A step started ahead
(a standby step, started as the attempt trains) connects to the supervisor of the attempt it follows on the same
node, never accepted, and learns of that supervisor's end from the reset of its connection: at once, and without
one lookup of the shared job folder however long the attempt trains. Only then does it look for the batch shell's
word there (node.supervisor.supervisor). A name held by another user's process is not this job's: the waiter then
goes on at once.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

BACKLOG = 8  # the steps started ahead that may wait on one supervisor (one at a time in practice)


def _address(job_dir: Path, attempt: int, node: int) -> str:
    """Unique to the job (its folder: job ids repeat across clusters), short enough for any path (108 bytes)."""
    return f"\0slurm-titan/{hashlib.sha256(str(job_dir).encode()).hexdigest()[:32]}/{attempt}/{node}"


class Presence:
    """Held by the supervisor of `attempt` on node `node` for its life (closed with the process)."""

    def __init__(self, job_dir: Path, attempt: int, node: int) -> None:
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(_address(job_dir, attempt, node))
            self.sock.listen(BACKLOG)
        except OSError:  # the name is taken (by whom?): a waiter that connects to it checks its owner
            self.sock.close()
            self.sock = None

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def wait_gone(job_dir: Path, attempt: int, node: int, stop: Callable[[], bool], poll_s: float = 0.5) -> bool:
    """Wait until the supervisor of `attempt` on node `node` of this machine is gone (at once when none is here);
    False when `stop()` said so first (asked every `poll_s`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(_address(job_dir, attempt, node))
        except OSError:  # none listens: gone already (or never here)
            return True
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():  # not this job's supervisor
            return True
        sock.settimeout(poll_s)
        while not stop():
            try:
                if not sock.recv(1):
                    return True
            except TimeoutError:
                continue
            except OSError:  # reset: the listening socket closed with its process
                return True
    return False
