"""slurm_titan.node.process_exit: a process's end is heard as it happens, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys

from slurm_titan.node.process_exit import wait_for_exit


def _child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_end_of_any_of_the_processes_ends_the_wait() -> None:
    long, short = _child(60), _child(0)
    try:
        assert wait_for_exit([long.pid, short.pid], 60)  # True: woken by the short one's end, not the timeout
        assert short.wait(5) == 0 and long.poll() is None
    finally:
        long.kill()
        long.wait()


def test_a_running_process_or_none_waits_out_the_timeout() -> None:
    assert not wait_for_exit([], 0)
    child = _child(60)
    try:
        assert not wait_for_exit([child.pid], 0.05)
    finally:
        child.kill()
        child.wait()


def test_an_unreaped_child_counts_as_ended_and_a_reaped_one_as_gone() -> None:
    child = _child(0)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # until it has ended, left unreaped
    assert wait_for_exit([child.pid], 60)
    child.wait()
    assert wait_for_exit([child.pid], 60)  # reaped: no such process (ProcessLookupError)
