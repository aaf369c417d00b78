"""Each rank's progress, told to its node supervisor: one fixed-size record per rank, rewritten in place.

The supervisor creates `<dir>/rank-R.progress` (node-local tmpfs: /dev/shm when there is one) before it
starts the rank, and names it in envvars.PROGRESS_FILE. The rank rewrites the record with one
`os.pwrite` at every phase change and at the end of every step (a few microseconds: see
tools/bench/progress_hook.py), after one reading of the rank's threads' schedstat (records.schedstat: tens of
microseconds, tools/bench/straggler.py); the supervisor's watchdog reads it every poll. A sequence number at both
ends of the record tells a reader a torn read (pwrite and read are not atomic on every file system), and
it reads again.

Record: the current phase and step, `since` (wall-clock time of the rank's last progress: when it
entered the phase), the steps this rank finished in this attempt, the slowest of them (seconds), and over
those steps the rank's working time (`work_s`: the CPU time its threads wanted, records.schedstat; what it
waited for its peers in collectives is not in it) and their wall time (`wall_s`). Checkpoint saves, the
restore and start-up are other phases: neither sum counts them. On an accelerator also the device time of
the chip's probe (rank.device_probe: `device_s` over `probes`, the same work at every step).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from slurm_titan import envvars
from slurm_titan.records.schedstat import WantedTime

_RECORD = struct.Struct("<QqiiddqdddqQ")
# seq, step, phase, pad, since, slowest_step_s, steps_done, work_s, wall_s, device_s, probes, seq


class Phase(IntEnum):
    STARTUP = 1
    RESTORE = 2
    STEP = 3
    SAVE = 4
    UPLOAD = 5
    DONE = 6

    @property
    def label(self) -> str:
        return {1: "start-up", 2: "restore", 3: "step", 4: "checkpoint save", 5: "final upload", 6: "done"}[self.value]


@dataclass(frozen=True)
class Progress:
    phase: Phase
    step: int  # the step being trained (STEP) or saved (SAVE); the last one trained otherwise
    since: float  # time.time() of the last progress
    steps_done: int = 0  # steps finished in this attempt
    slowest_step_s: float = 0.0  # the slowest of them
    work_s: float = 0.0  # the CPU time the rank wanted (ran + waited for a CPU) in those steps
    wall_s: float = 0.0  # their wall time
    device_s: float = 0.0  # the device time of the chip's probes that completed (none on the CPU)
    probes: int = 0  # how many


def encode(progress: Progress, seq: int) -> bytes:
    return _RECORD.pack(seq, progress.step, int(progress.phase), 0, progress.since, progress.slowest_step_s,
                        progress.steps_done, progress.work_s, progress.wall_s, progress.device_s, progress.probes,
                        seq)


def create(path: Path, since: float) -> None:
    """The record a rank starts with (the supervisor writes it before starting the rank)."""
    path.write_bytes(encode(Progress(Phase.STARTUP, 0, since), 0))


def read(path: Path, tries: int = 5) -> Progress | None:
    """The rank's last record; None when it is missing or stays torn."""
    for _ in range(tries):
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if len(data) != _RECORD.size:
            return None
        seq, step, phase, _, since, slowest, done, work, wall, device, probes, seq_end = _RECORD.unpack(data)
        if seq == seq_end:
            return Progress(Phase(phase), step, since, done, slowest, work, wall, device, probes)
    return None


class ProgressWriter:
    """The rank's side: :meth:`enter` a phase, :meth:`step_done` after every step."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY)
        self._seq = 0
        self._phase, self._step, self._since = Phase.STARTUP, 0, time.time()
        self._done, self._slowest, self._work, self._wall = 0, 0.0, 0.0, 0.0
        self._device, self._probes = 0.0, 0
        self._wanted = WantedTime()
        self._mark = 0.0  # the wanted time when the current phase began

    def _write(self) -> None:
        self._seq += 1
        record = Progress(self._phase, self._step, self._since, self._done, self._slowest, self._work, self._wall,
                          self._device, self._probes)
        os.pwrite(self._fd, encode(record, self._seq), 0)

    def enter(self, phase: Phase, step: int | None = None) -> None:
        self._phase, self._since, self._mark = phase, time.time(), self._wanted.sample()
        if step is not None:
            self._step = step
        self._write()

    def step_done(self, step: int, device: tuple[float, int] = (0.0, 0)) -> None:
        """Step `step` ended: note its duration and working time (from the start of the STEP phase), and the
        chip probe's `device` (seconds, probes) so far; step `step + 1` begins."""
        now, wanted = time.time(), self._wanted.sample()
        self._device, self._probes = device
        if self._phase == Phase.STEP:
            self._done += 1
            self._slowest = max(self._slowest, now - self._since)
            self._work += wanted - self._mark
            self._wall += now - self._since
        self._phase, self._step, self._since, self._mark = Phase.STEP, step + 1, now, wanted
        self._write()


_writer: ProgressWriter | None = None


def writer() -> ProgressWriter | None:
    """This rank's writer, opened on first use; None when the supervisor asked for no record."""
    global _writer
    if _writer is None and (path := os.environ.get(envvars.PROGRESS_FILE)):
        _writer = ProgressWriter(path)
    return _writer


def enter(phase: Phase, step: int | None = None) -> None:
    if progress := writer():
        progress.enter(phase, step)


def step_done(step: int, device: tuple[float, int] = (0.0, 0)) -> None:
    if progress := writer():
        progress.step_done(step, device)
