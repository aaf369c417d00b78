"""A rank's :class:`~slurm_titan.ckpt.upload.CheckpointSync`, run in a child process of its own.

Uploading in a thread of the training process costs training more than the CPU it uses: every
bit of Python the upload runs (HTTP, retries, receipts) holds the GIL that the training loop
needs to launch each operator. ``tools/bench/upload_interference.py`` measured a training loop
on one core 1.52x slower while a thread of its process uploaded from another core without a
pause, and 1.11x slower while a child process did the same uploads (5 rounds). So each rank
starts one child (``python -m slurm_titan.ckpt.upload_child_main``) and talks to it over a pipe;
:class:`UploaderProcess` offers the parent the same calls as CheckpointSync (both are an
:class:`~slurm_titan.ckpt.upload.Uploader`).

The child runs at a lower priority and, with ``cpus``, on CPUs of its own (the whole process: its
transfer threads inherit both). It ignores the stop signals (the rank decides when to stop and
waits for the commit) and exits with its parent. Its log lines go to the rank's log.

Protocol, one JSON object per line: the parent sends the :class:`UploadSettings` (:meth:`~UploadSettings.to_message`),
then ``{"op": "submit", "step": N, "reads": [[path, offset, length], ...] or null, "spans": {path: [[offset,
length], ...]}}`` and finally ``{"op": "close", "timeout": T}``; the child answers
``{"event": "ready", "location": ...}`` (or ``{"event": "error", "message": ...}`` and exits),
``{"event": "done", "step": N, "status": ...}`` once this rank's part of step N (rank 0: the
commit) has finished, and ``{"event": "closed", "ok": ...}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_titan.ckpt.storage.errors import redact
from slurm_titan.envvars import RankCheckpointEnv
from slurm_titan.errors import StorageError
from slurm_titan.retention import KEEP_ALL, Retention
from slurm_titan.signals import STOP_SIGNALS

log = logging.getLogger("slurm_titan.ckpt.upload_process")

STOP_SIGNALS_AND_INT = (*STOP_SIGNALS, signal.SIGINT)
CHILD_MODULE = "slurm_titan.ckpt.upload_child_main"


@dataclass(frozen=True, kw_only=True)
class UploadSettings:
    """What a rank's uploader needs: the child builds its CheckpointSync from it (see that class for each field;
    the job's settings keep the names of the `checkpoint:` section)."""

    remote: str
    endpoint_url: str | None = None
    local_folder: str
    rank: int = 0
    world_size: int = 1
    config_digest: str = ""
    attempt: str | None = None
    retention: Retention = KEEP_ALL
    nice: int = 10
    upload_cpus: frozenset[int] | None = None
    upload_rate: float = 0.0

    @classmethod
    def from_rank_env(cls, checkpoint: RankCheckpointEnv, *, local_folder: str, rank: int,
                      world_size: int) -> UploadSettings:
        """The settings of the uploader of `rank` (of `world_size`), whose checkpoints torchtitan saves in
        `local_folder`: the job's `checkpoint` settings as the supervisor passed them to the rank."""
        return cls(remote=checkpoint.remote, endpoint_url=checkpoint.endpoint_url, local_folder=local_folder,
                   rank=rank, world_size=world_size, config_digest=checkpoint.config_digest,
                   retention=checkpoint.retention, upload_cpus=checkpoint.upload_cpus,
                   upload_rate=checkpoint.upload_rate)

    def to_message(self) -> dict[str, Any]:
        """The first line the child reads (JSON-ready)."""
        cpus = None if self.upload_cpus is None else sorted(self.upload_cpus)
        return dataclasses.asdict(self) | {"upload_cpus": cpus}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> UploadSettings:
        """The settings :meth:`to_message` sent."""
        cpus = message["upload_cpus"]
        return cls(**message | {"retention": Retention(**message["retention"]),
                                "upload_cpus": None if cpus is None else frozenset(cpus)})


class UploaderProcess:
    """An :class:`~slurm_titan.ckpt.upload.Uploader`: CheckpointSync's calls (submit, wait, status,
    in_flight, submitted, close), served by a child process. Construction starts the child and returns: its
    imports and the opening of the remote location (~1 s) overlap what the rank does meanwhile (the node's
    restore, the trainer's build, the first steps). :meth:`ready` (the first submit calls it) raises
    StorageError (one line) if the child cannot open the remote location, as CheckpointSync would."""

    def __init__(self, settings: UploadSettings, start_timeout: float = 300.0) -> None:
        self.location = redact(settings.remote)  # the child's own name for it once it is ready
        self._start_deadline = time.monotonic() + start_timeout
        self._start_timeout = start_timeout
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._submitted: set[int] = set()
        self._done: dict[int, str] = {}
        self._ready = False
        self._closed: bool | None = None  # the child's answer to close
        self._ended: str | None = None  # why the child is gone, once it is
        self._close_sent = False
        # The child inherits this thread's signal mask through exec: blocked, a stop signal that
        # comes before the child ignores it stays pending instead of killing it.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS_AND_INT)
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=_child_env())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        self._send(settings.to_message())
        self._reader = threading.Thread(target=self._read_events, name=f"ckpt-uploader-r{settings.rank}",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def ready(self) -> None:
        """Wait until the child has opened the remote location, at most until the start timeout ends (counted from
        the start); StorageError (one line) when it could not, or did not in time (the child is then ended)."""
        with self._cond:
            remaining = max(0.0, self._start_deadline - time.monotonic())
            if not self._cond.wait_for(lambda: self._ready or self._ended, remaining):
                self._ended = f"the uploader process did not start within {self._start_timeout:.0f} s"
        if not self._ready:
            self._kill()
            raise StorageError(self._ended or "the uploader process did not start")

    # ------------------------------------------------------------------------------ API
    def submit(self, step: int, reads: list[tuple[str, int, int]] | None = None,
               spans: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """Queue the upload of this rank's files of step N (returns at once once the child is :meth:`ready`);
        ``reads``, ``spans``: see CheckpointSync.submit."""
        self.ready()
        step = int(step)
        with self._cond:
            if self._close_sent:
                raise RuntimeError("the uploader is closed")
            if step in self._submitted:
                log.warning("checkpoint step %d was already submitted; ignoring", step)
                return
            self._submitted.add(step)
        self._send({"op": "submit", "step": step, "reads": reads, "spans": spans})

    def submitted(self, step: int) -> bool:
        with self._cond:
            return int(step) in self._submitted

    def wait(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Block until this rank's part of `step` (rank 0: the commit; None: every step submitted)
        has finished. True if it succeeded; False on failure, timeout or a dead uploader."""
        with self._cond:
            steps = set(self._submitted) if step is None else {int(step)} & self._submitted
            self._cond.wait_for(lambda: steps <= self._done.keys() or self._ended is not None, timeout)
            return steps <= self._done.keys() and not any(self._done[s].startswith("failed") for s in steps)

    def status(self, step: int) -> str:
        """The child's final status of `step` (see CheckpointSync.status), "in flight", or
        "failed: <why>" once the child is gone, or "unknown"."""
        with self._cond:
            if step in self._done:
                return self._done[step]
            if step not in self._submitted:
                return "unknown"
            return f"failed: {self._ended}" if self._ended else "in flight"

    def in_flight(self) -> set[int]:
        with self._cond:
            return self._submitted - self._done.keys()

    def close(self, timeout: float | None = None) -> bool:
        """Let the child finish what was submitted (up to `timeout` s), then end it. True if
        every submitted step succeeded."""
        with self._cond:
            first = not self._close_sent
            self._close_sent = True
        if first:
            self._send({"op": "close", "timeout": timeout})
        grace = None if timeout is None else timeout + 30.0
        with self._cond:
            self._cond.wait_for(lambda: self._closed is not None or self._ended is not None, grace)
            ok = bool(self._closed)
        self._kill()
        return ok and self.wait(None, 0)

    # ------------------------------------------------------------------------------ pipe
    def _send(self, message: dict[str, Any]) -> None:
        try:
            with self._write_lock:
                self._proc.stdin.write((json.dumps(message) + "\n").encode())  # type: ignore[union-attr]
                self._proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError):
            self._gone()

    def _read_events(self) -> None:
        for raw in self._proc.stdout:  # type: ignore[union-attr]
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                kind = event.get("event")
                if kind == "ready":
                    self._ready, self.location = True, event.get("location", "")
                elif kind == "error":
                    self._ended = event.get("message", "the uploader process failed")
                elif kind == "done":
                    self._done[int(event["step"])] = str(event["status"])
                elif kind == "closed":
                    self._closed = bool(event.get("ok"))
                self._cond.notify_all()
        self._gone()

    def _gone(self) -> None:
        code = self._proc.wait()
        with self._cond:
            if self._ended is None:
                self._ended = f"the uploader process (pid {self._proc.pid}) exited with code {code}"
                if self._closed is None and self.in_flight():
                    log.error("%s; checkpoint steps %s were not uploaded", self._ended, sorted(self.in_flight()))
            self._cond.notify_all()

    def _kill(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()
        self._proc.wait()


def _child_env() -> dict[str, str]:
    """This process's environment, with the folder this package is imported from first on
    PYTHONPATH (the child must import the same slurm_titan, installed or not)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{path}" if path else root)
