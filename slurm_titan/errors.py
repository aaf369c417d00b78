"""Errors that the CLI turns into one clear line, and the one table of every exit code slurm-titan gives."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code of the CLI, the node supervisors and the ranks. The supervisor's codes (74-78, 124)
    tell the batch shell and `finish` what happened to an attempt; the sysexits names say why each number."""

    ERROR = 1  # a user-facing failure (SlurmTitanError)
    CONFIG = 2  # a job config is wrong
    CLUSTER = 3  # Slurm refused or is unreachable
    STORAGE = 4  # checkpoint storage unreachable, refused, or corrupt (CLI)
    BAD_CHECKPOINT = 5  # `ckpt verify` found a damaged checkpoint
    STORAGE_UNREACHABLE = 74  # EX_IOERR: checkpoint storage unreachable before training
    PREEMPTED = 75  # EX_TEMPFAIL: stopped for a preemption or the time limit; "try again later"
    REQUEUE_FAILED = 76  # the job had to requeue itself and Slurm refused
    PREFLIGHT = 78  # EX_CONFIG: the node is not fit to run this job; never requeued
    HANG = 124  # like timeout(1): the attempt made no progress within its budget


class SlurmTitanError(Exception):
    """A user-facing failure: its message is printed as one line, the CLI exits with `exit_code`."""

    exit_code: int = ExitCode.ERROR


class ConfigError(SlurmTitanError):
    """A job config is wrong; names where (file, key) and what is wrong."""

    exit_code = ExitCode.CONFIG

    def __init__(self, where: str, key: str | None, problem: str) -> None:
        self.where, self.key, self.problem = where, key, problem
        location = f"{where}: {key}" if key else where
        super().__init__(f"{location}: {problem}")


class ClusterError(SlurmTitanError):
    """Slurm refused or is unreachable (missing sbatch/scontrol, unknown partition, too many nodes)."""

    exit_code = ExitCode.CLUSTER


class RunError(SlurmTitanError):
    """A run or its checkpoint location does not allow what was asked: an unknown run or job to resume, a
    location that holds checkpoints for a fresh start, a writer lease held by another job or corrupt."""

    exit_code = ExitCode.CONFIG


class StorageError(SlurmTitanError):
    """Checkpoint storage is unreachable, refused access, or holds something corrupt."""

    exit_code = ExitCode.STORAGE
