"""The signals slurm-titan's processes share: Slurm's stop warnings, and the stack-dump request.

Slurm warns before it takes the nodes: the `--signal` signal (USR2) ahead of the time limit or on
preemption (`preempt_send_user_signal`), SIGTERM when it kills. The batch script starts each node's
supervisor with both blocked (`env --block-signal`), so one that comes while Python and submitit
start waits for :func:`take_stop_signals`. The supervisor starts the ranks with both ignored
(:func:`ignore_signals`), so one that comes while torch is still importing cannot kill them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
DUMP_SIGNAL = signal.SIGUSR1  # a rank's faulthandler dumps its stacks on it; unused by Slurm's warnings

Handler = Callable[[int, FrameType | None], None]


def take_stop_signals(handler: Handler) -> None:
    """Route the stop signals to `handler`, then unblock them: one that came while they were
    blocked is handled now."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def ignore_signals() -> None:
    """A late stop signal must not kill the process (on the way in while torch imports, and on the
    way out while it exits with its checkpoint saved)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
