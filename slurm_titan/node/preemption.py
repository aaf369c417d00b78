"""Turn Slurm's warning signals into a checkpoint every rank agrees on (runs inside each rank).

Slurm warns before it takes the nodes: the `--signal` signal (USR2) ahead of the time limit or on
preemption (`preempt_send_user_signal`), SIGTERM when it kills. The batch script starts each
node's supervisor with both signals blocked (`env --block-signal`), so one that comes while the
interpreter and submitit start waits for :func:`take_stop_signals` instead of killing the
supervisor or reaching submitit's handler. The supervisor starts the ranks with both signals
ignored (so one that comes while torch is still importing cannot kill them) and leaves a stop
file when it gets one, which the rank reads too. The handler only sets a flag; at the next step
boundary `agreed_stop()` combines the flags of all ranks with one all_reduce(MAX), so every rank
saves the same step and exits with `PREEMPTED_EXIT_CODE`, which tells the node supervisor to
requeue the job.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
STOP_FILE_ENV = "SLURM_TITAN_STOP_FILE"


@dataclass
class StopRequest:
    signal_name: str
    received: float


_request: StopRequest | None = None


def _request_stop(cause: str) -> None:
    global _request
    if _request is None:
        _request = StopRequest(cause, time.time())
        print(f"[slurm-titan rank {os.environ.get('RANK', '?')}] got {cause}: "
              "will checkpoint at the end of this step and stop", file=sys.stderr, flush=True)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _request_stop(signal.Signals(signum).name)


def take_stop_signals(handler: Callable[[int, FrameType | None], None]) -> None:
    """Route the stop signals to `handler`, then unblock them: one that came while they were
    blocked (see the module docstring) is handled now."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def install_handlers() -> None:
    """Catch the stop signals; run first thing in the rank, before torch is imported.

    A signal that came while the rank still ignored them is in the supervisor's stop file, read
    once here: the supervisor writes that file before it passes a signal on, so any later signal
    reaches the handler itself.
    """
    take_stop_signals(_on_signal)
    stop_file = os.environ.get(STOP_FILE_ENV)
    if stop_file and os.path.exists(stop_file):
        _request_stop(open(stop_file, encoding="utf-8").read().strip() or "stop file")


def ignore_signals() -> None:
    """For the way out (and the way in, see the supervisor): a late signal must not kill the rank
    while it exits with its checkpoint saved."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def exit_for_requeue() -> NoReturn:
    """Leave at once once the checkpoint is committed: a normal interpreter shutdown of a large
    torch process takes seconds (measured 6-7 s here) that count against Slurm's grace time."""
    ignore_signals()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)


def stop_requested() -> StopRequest | None:
    return _request


def agreed_stop() -> bool:
    """True on every rank when any rank got a stop signal; a collective: all ranks must call it."""
    import torch
    import torch.distributed as dist

    local = 1 if _request is not None else 0
    if not dist.is_available() or not dist.is_initialized():
        return bool(local)
    device = "cpu" if dist.get_backend() == "gloo" else _accelerator()
    flag = torch.tensor([local], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _accelerator() -> str:
    from torchtitan.tools.utils import device_module, device_type

    return f"{device_type}:{device_module.current_device()}"
