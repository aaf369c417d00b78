"""What a node's checkpoint restore and its ranks tell each other at each rank's gate pipe: JSON lines.

node.supervisor's RankGroup writes, rank.restore_gate reads. Before the verdict the supervisor may send plan
requests (:class:`PlanRequest`, on another world size than the save's: node.supervisor.restore); the rank answers each
with a reads file (:func:`write_reads`, read back by :func:`read_reads`). The verdict line
(:class:`RestoreVerdict`, decided by node.supervisor.restore) ends it; the pipe closed without one means the restore
failed or was cut short.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

Reads = list[tuple[str, int, int]]
"""Byte ranges (file, offset, length) of a step folder."""


@dataclass(frozen=True)
class RestoreVerdict:
    """The restore's outcome as the ranks need it."""

    world_size_changed: bool = False  # saved by another world size: DCP reshards model and optimizer
    memory: str = ""  # a RAM snapshot's step folder (ram.layout.step_dir): each rank loads its rank-R from there

    def to_line(self) -> bytes:
        return (json.dumps({"verdict": asdict(self)}) + "\n").encode()


@dataclass(frozen=True)
class PlanRequest:
    """Work out which byte ranges this rank's DCP load of a candidate checkpoint reads, and write them."""

    metadata: str
    """A folder holding the candidate's DCP ``.metadata``."""
    reads: str
    """Where this rank writes its answer (:func:`write_reads`)."""

    def to_line(self) -> bytes:
        return (json.dumps({"plan": asdict(self)}) + "\n").encode()


def parse_line(line: bytes) -> RestoreVerdict | PlanRequest:
    """One message of the gate pipe. ValueError when it is none."""
    try:
        message = json.loads(line)
        if "plan" in message:
            return PlanRequest(**message["plan"])
        return RestoreVerdict(**message["verdict"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a restore gate message: {line[:200]!r} ({e})") from None


def write_reads(path: str, reads: Reads | None, error: str = "") -> None:
    """A rank's answer to a plan request: its reads, or why it cannot tell. Atomic (tmp + rename): the
    supervisor takes the file once it exists."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump({"reads": reads} if reads is not None else {"error": error}, out)
    os.replace(tmp, path)


def read_reads(path: str) -> Reads:
    """The reads a rank wrote to ``path``. ValueError (one line) when it could not tell, or the file is not one."""
    try:
        with open(path, "rb") as f:
            answer = json.load(f)
        error = answer.get("error")
        reads = [] if error is not None else [(str(p), int(o), int(n)) for p, o, n in answer["reads"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a reads file ({e})") from None
    if error is not None:
        raise ValueError(str(error))
    return reads
