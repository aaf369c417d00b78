"""Turn Slurm's warning signals into a checkpoint every rank agrees on (runs inside each rank).

Slurm's stop signals reach the rank as :mod:`slurm_titan.signals` describes; the supervisor also
leaves a stop file when it gets one, which the rank reads too. The handler only sets a flag; at the next step
boundary `agreed_stop()` combines the flags of all ranks with one all_reduce(MAX), so every rank
saves the same step and exits with `ExitCode.PREEMPTED`, which tells the node supervisor to
requeue the job.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from slurm_titan import envvars
from slurm_titan.errors import ExitCode
from slurm_titan.signals import ignore_signals, take_stop_signals


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


def install_handlers() -> None:
    """Catch the stop signals; run first thing in the rank, before torch is imported.

    A signal that came while the rank still ignored them is in the supervisor's stop file, read
    once here: the supervisor writes that file before it passes a signal on, so any later signal
    reaches the handler itself.
    """
    take_stop_signals(_on_signal)
    stop_file = os.environ.get(envvars.STOP_FILE)
    if stop_file and os.path.exists(stop_file):
        with open(stop_file, encoding="utf-8") as f:
            reason = f.read().strip()
        _request_stop(reason or "stop file")


def exit_for_requeue() -> NoReturn:
    """Leave at once once the checkpoint is committed: a normal interpreter shutdown of a large
    torch process takes seconds (measured 6-7 s here) that count against Slurm's grace time."""
    ignore_signals()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ExitCode.PREEMPTED)


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
