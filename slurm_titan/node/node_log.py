"""The node log's line format, shared by the batch shell and the node supervisor (both print to submitit's node log)."""

from __future__ import annotations

import socket
import time


def say(message: str) -> None:
    """One line of the node log: `[slurm-titan HOST HH:MM:SS.mmm] message`."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    print(f"[slurm-titan {socket.gethostname()} {stamp}] {message}", flush=True)
