"""`slurm-titan logs`: a job's node logs (submitit's per-task files) or one rank's log, optionally followed;
with `--stacks`, the ranks' stacks the watchdog took on a hang (the newest attempt that has them).

Followed without `--rank`, the node logs come with training's progress: each step's loss /
throughput line of rank 0 (torchtitan's `MetricsProcessor.log`, `step: N  loss: ...  tps: ...`),
colours stripped, as it is written.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from slurm_titan import slurm
from slurm_titan.errors import SlurmTitanError
from slurm_titan.records import jobs, run_folder

FOLLOW_POLL_S = 1.0
FOLLOW_STATE_S = 5.0
PROGRESS_RANK = 0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP_LINE = re.compile(r"\bstep:\s*\d+\s+loss:")


def log_files(job_dir: Path, job_id: str, rank: int | None) -> list[Path]:
    if rank is not None:
        return [run_folder.rank_log(job_dir, rank)]
    return run_folder.node_logs(job_dir, job_id)


def progress_lines(text: str, rank: int) -> str:
    """The step lines (loss, throughput) of `text`, colours stripped, each tagged with its rank."""
    lines = (_ANSI.sub("", line) for line in text.splitlines())
    return "".join(f"[rank {rank}] {line.strip()}\n" for line in lines if _STEP_LINE.search(line))


class Tail:
    """What a file gained since the last read (from its start again if it shrank); with
    `whole_lines`, a line still being written waits for its end."""

    def __init__(self, path: Path, whole_lines: bool = False) -> None:
        self.path, self.whole_lines, self.offset = path, whole_lines, 0

    def read(self) -> str:
        try:
            with self.path.open("rb") as handle:
                if handle.seek(0, 2) < self.offset:
                    self.offset = 0
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return ""
        if self.whole_lines:
            chunk = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(chunk)
        return chunk.decode("utf-8", "replace")


class Follower:
    """One poll at a time of a job's logs: the node logs (or `rank`'s log) and, with `progress_rank`,
    that rank's step lines."""

    def __init__(self, job_dir: Path, job_id: str, rank: int | None, progress_rank: int | None) -> None:
        self.job_dir, self.job_id, self.rank = job_dir, job_id, rank
        self.tails: dict[Path, Tail] = {}
        self.progress = None if progress_rank is None else (progress_rank,
                                                            Tail(run_folder.rank_log(job_dir, progress_rank), True))

    def files(self) -> list[Path]:
        return log_files(self.job_dir, self.job_id, self.rank)

    def poll(self) -> str:
        """Everything new since the last poll."""
        files = self.files()
        out = []
        for path in files:
            chunk = self.tails.setdefault(path, Tail(path)).read()
            if chunk:
                out.append(("" if len(files) == 1 else f"==> {path.name} <==\n") + chunk)
        if self.progress is not None:
            progress_rank, tail = self.progress
            out.append(progress_lines(tail.read(), progress_rank))
        return "".join(out)


def newest_stacks(job_dir: Path) -> list[Path]:
    """The stack files of the newest attempt that has any, by node."""
    for attempt in reversed(run_folder.attempt_numbers(job_dir)):
        if files := run_folder.stack_files(job_dir, attempt):
            return files
    return []


def show_stacks(job_id: str) -> int:
    record = jobs.load(job_id)
    files = newest_stacks(record.folder)
    if not files:
        raise SlurmTitanError(f"no stacks for job {job_id} in {record.job_dir}: the watchdog saw no hang")
    for path in files:
        sys.stdout.write(f"==> attempt {path.parent.parent.name} {path.stem} ({path}) <==\n"
                         + path.read_text(errors="replace").rstrip("\n") + "\n")
    return 0


def _finished(job_id: str) -> bool:
    state = slurm.job_state(job_id)
    return state is None or state.state in slurm.FINISHED_STATES


def show(job_id: str, rank: int | None = None, follow: bool = False) -> int:
    record = jobs.load(job_id)
    follower = Follower(record.folder, job_id, rank, PROGRESS_RANK if follow and rank is None else None)
    if not follow and not follower.files():
        raise SlurmTitanError(f"no logs yet for job {job_id} in {record.job_dir}"
                              + (f" for rank {rank}" if rank is not None else ""))
    asked = -FOLLOW_STATE_S
    while True:
        done = not follow
        if follow and time.monotonic() - asked >= FOLLOW_STATE_S:  # Slurm is asked every few polls, not every one
            asked, done = time.monotonic(), _finished(job_id)
        text = follower.poll()
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
        if done:
            return 0
        time.sleep(FOLLOW_POLL_S)
