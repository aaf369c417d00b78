"""`python -m slurm_titan.ckpt.upload_child_main`: the uploader child a rank starts through
:class:`~slurm_titan.ckpt.upload_process.UploaderProcess` (that module states why and the protocol).

It runs a CheckpointSync at a lower priority (and, with ``cpus``, on CPUs of its own), ignores the stop
signals, exits with its parent and logs to the rank's log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from typing import IO, Any

from slurm_titan.ckpt.upload_process import STOP_SIGNALS_AND_INT, UploadSettings
from slurm_titan.errors import StorageError
from slurm_titan.thread_priority import background_thread

_LOG_FORMAT = "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when the parent does; exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def serve(commands: IO[str], events: IO[str]) -> int:
    """The child: read the settings and then commands from `commands`, answer on `events`."""
    settings = UploadSettings.from_message(json.loads(commands.readline()))
    # the whole process at once, before the imports: every thread started from here on inherits both
    background_thread(settings.nice, settings.upload_cpus)
    from slurm_titan.ckpt.upload import CheckpointSync

    lock = threading.Lock()

    def say(event: dict[str, Any]) -> None:
        with lock:
            events.write(json.dumps(event) + "\n")
            events.flush()

    try:
        # its threads inherit the priority and CPUs set above: they lower and confine themselves no further
        sync = CheckpointSync.from_settings(dataclasses.replace(settings, nice=0, upload_cpus=None))
    except StorageError as e:
        say({"event": "error", "message": str(e)})
        return 1
    say({"event": "ready", "location": sync.store.location})

    def report(step: int) -> None:
        sync.wait(step)
        say({"event": "done", "step": step, "status": sync.status(step)})

    reporters: list[threading.Thread] = []
    for line in commands:
        command = json.loads(line)
        if command["op"] == "submit":
            reads = command.get("reads")
            spans = {p: [tuple(v) for v in vs] for p, vs in (command.get("spans") or {}).items()}
            sync.submit(command["step"], None if reads is None else [tuple(r) for r in reads], spans)
            reporters.append(threading.Thread(target=report, args=(command["step"],), daemon=True))
            reporters[-1].start()
        elif command["op"] == "close":
            ok = sync.close(command.get("timeout"))
            for reporter in reporters:  # their "done" goes out before "closed"
                reporter.join(1.0)
            say({"event": "closed", "ok": ok})
            return 0 if ok else 1
    return 0  # the parent is gone: nothing is left to wait for the uploads


def main() -> int:
    parent = os.getppid()
    for signum in STOP_SIGNALS_AND_INT:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS_AND_INT)
    _die_with_parent(parent)
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed goes to the rank's log, not into the event pipe
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr)
    return serve(sys.stdin, events)


if __name__ == "__main__":
    sys.exit(main())
