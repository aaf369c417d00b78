"""Errors that the CLI turns into one clear line and a non-zero exit code."""

from __future__ import annotations


class SlurmTitanError(Exception):
    """A user-facing failure: its message is printed as one line, the CLI exits with `exit_code`."""

    exit_code: int = 1


class ConfigError(SlurmTitanError):
    """A job config is wrong; names where (file, key) and what is wrong."""

    exit_code = 2

    def __init__(self, where: str, key: str | None, problem: str) -> None:
        self.where, self.key, self.problem = where, key, problem
        location = f"{where}: {key}" if key else where
        super().__init__(f"{location}: {problem}")


class ClusterError(SlurmTitanError):
    """Slurm refused or is unreachable (missing sbatch/scontrol, unknown partition, too many nodes)."""

    exit_code = 3


class StorageError(SlurmTitanError):
    """Checkpoint storage is unreachable, refused access, or holds something corrupt."""

    exit_code = 4
