"""What the login node hands the batch shell's processes: one typed JSON file in the job folder.

`launch.plan` builds a BatchSpec from the job config; the sbatch script's first lines write it into the job folder
(records.run_folder.batch_spec_file, a quoted heredoc: `submit --dry-run` shows it, planning writes nothing), and
node.batch.titan_check, node.batch.allocation and node.batch.finish read it there (:meth:`BatchSpec.load`). The node
supervisors get theirs pickled by submitit (node.spec.NodeSpec); the batch shell's processes are started by the
script itself, hence a file. The job folder is where the file is, so it is not in it: the script fills the job's id
into the folder's path once and passes the folder to every process (`--job-dir`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from slurm_titan.errors import SlurmTitanError
from slurm_titan.node.straggler_config import StragglerPlan
from slurm_titan.records import run_folder

FORMAT = 1
"""The file's layout; a file of another format is refused (the script that wrote it belongs to another version)."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """`preemption.*`: caps on requeues (planned stops) and on failed attempts (node.batch.outcome.decide)."""

    max_requeues: int
    max_failures: int
    max_failures_without_progress: int


@dataclass(frozen=True, kw_only=True)
class LeasePlan:
    """The checkpoint location whose writer lease the batch shell takes and renews (node.batch.lease): `remote` as
    planned (`{job_id}` filled in by the batch shell), and `take_over` (`submit --take-over`)."""

    remote: str
    endpoint_url: str | None = None
    take_over: bool = False


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Everything the batch shell's processes need of the job config."""

    nodes: int  # slurm.nodes: each attempt's node count (the allocation has the spares too)
    shrink_to: tuple[int, ...]  # the node counts a run may go on with when too few are left, largest first
    retry: RetryPolicy
    signal_seconds: int  # preemption.signal_seconds: how long before the time limit Slurm's warning comes
    titan_module: str  # torchtitan.module and torchtitan.config, checked before any node starts
    titan_config: str
    straggler: StragglerPlan  # the slow-node judge of the step watcher (node.batch.slow_watch)
    lease: LeasePlan | None = None  # the writer lease of the remote checkpoint location (none without one)
    memory_dir: str | None = None  # checkpoint.memory.dir with the RAM tier on: what a failed job leaves is removed
    standby_step: bool = False  # preemption.standby_step: the next attempt's step started as each attempt trains

    def to_json(self) -> str:
        """The file's text: `format`, then the fields in order, one per line (the dry run shows it); no `lease`
        or `memory_dir` without one, no `standby_step` when off."""
        fields_ = asdict(self)
        for optional in ("lease", "memory_dir", "standby_step"):
            if fields_[optional] in (None, False):
                del fields_[optional]
        return json.dumps({"format": FORMAT, **fields_}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BatchSpec:
        """The spec `text` holds; ValueError saying what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        retry, shrink_to, straggler = (_field(data, "retry", dict), _field(data, "shrink_to", list),
                                       _field(data, "straggler", dict))
        lease = _optional(data, "lease", dict) if "lease" in data else None
        return cls(
            nodes=_field(data, "nodes", int),
            shrink_to=tuple(_typed(f"shrink_to[{i}]", count, int) for i, count in enumerate(shrink_to)),
            retry=RetryPolicy(**{f.name: _field(retry, f.name, int, "retry.") for f in fields(RetryPolicy)}),
            signal_seconds=_field(data, "signal_seconds", int),
            titan_module=_field(data, "titan_module", str),
            titan_config=_field(data, "titan_config", str),
            straggler=StragglerPlan(action=_field(straggler, "action", str, "straggler."),
                                    threshold=_field(straggler, "threshold", float, "straggler."),
                                    window_steps=_optional(straggler, "window_steps", int, "straggler."),
                                    warmup_steps=_field(straggler, "warmup_steps", int, "straggler."),
                                    total_steps=_optional(straggler, "total_steps", int, "straggler.")),
            lease=None if lease is None else LeasePlan(remote=_field(lease, "remote", str, "lease."),
                                                       endpoint_url=_optional(lease, "endpoint_url", str, "lease."),
                                                       take_over=_field(lease, "take_over", bool, "lease.")),
            memory_dir=_optional(data, "memory_dir", str) if "memory_dir" in data else None,
            standby_step=_field(data, "standby_step", bool) if "standby_step" in data else False,
        )

    @classmethod
    def load(cls, job_dir: Path) -> BatchSpec:
        """The spec of the job in `job_dir`; BatchSpecError (one line naming the file) when it is missing or
        malformed."""
        path = run_folder.batch_spec_file(job_dir)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise BatchSpecError(f"{path}: no batch spec (the sbatch script writes it before anything else runs)") \
                from None
        except OSError as error:
            raise BatchSpecError(f"{path}: unreadable batch spec ({error.strerror or error})") from None
        try:
            return cls.from_json(text)
        except ValueError as error:  # json.JSONDecodeError is one
            raise BatchSpecError(f"{path}: malformed batch spec ({error})") from None


class BatchSpecError(SlurmTitanError):
    """The job folder's batch spec is missing or malformed; the message names the file."""


def load_or_exit(job_dir: Path) -> BatchSpec:
    """:meth:`BatchSpec.load` for a batch-shell process's `main`: an error is one line on stderr and exit code 1."""
    try:
        return BatchSpec.load(job_dir)
    except BatchSpecError as error:
        print(f"slurm-titan: {error}", file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from None


def _typed(name: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name}: {value!r} is not {'an' if kind is int else 'a'} {kind.__name__}")
    return value


def _field(data: dict[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    if key not in data:
        raise ValueError(f"{prefix}{key} missing")
    return _typed(prefix + key, data[key], kind)


def _optional(data: dict[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    """A field that may be null."""
    return None if key in data and data[key] is None else _field(data, key, kind, prefix)
