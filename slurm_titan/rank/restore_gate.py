"""In a rank: wait at the gate for the node's checkpoint restore, answer its plan requests, take its verdict.

The supervisor starts the ranks first and restores while they import torch and build the model
(node.supervisor.restore); each rank's checkpoint hook waits here, at a pipe from the supervisor (envvars.RESTORE_FD),
before torchtitan looks at the checkpoint folder. On another world size than the save's the supervisor
first asks each rank which byte ranges its load of the candidate reads, so that the node fetches only
those (the messages: records.restore_verdict).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from slurm_titan import envvars
from slurm_titan.records.restore_verdict import PlanRequest, Reads, RestoreVerdict, parse_line, write_reads

RankPlanner = Callable[[str], Reads]
"""Given a folder holding a checkpoint's ``.metadata``: the byte ranges this rank's load of it reads."""


def wait_for_restore(plan: RankPlanner | None = None) -> RestoreVerdict | None:
    """Block until the node's restore is done; returns its verdict, None when the rank was started without
    a restore to wait for. Meanwhile each plan request is answered with ``plan`` (a rank without one, or
    whose ``plan`` raises, answers why it cannot tell: the node then fetches the whole checkpoint). The
    pipe is read once: a second call returns None. Raises RuntimeError when the restore failed or the
    supervisor went away (the node log says why)."""
    fd = os.environ.pop(envvars.RESTORE_FD, "")
    if not fd:
        return None
    with os.fdopen(int(fd), "rb") as pipe:
        for line in pipe:
            message = parse_line(line)
            if not isinstance(message, PlanRequest):
                return message
            try:
                if plan is None:
                    raise RuntimeError("this rank has no load planner")
                reads, why = plan(message.metadata), ""
            except Exception as e:  # noqa: BLE001 - the node fetches all of it instead
                reads, why = None, f"{type(e).__name__}: {e}"
            with contextlib.suppress(OSError):  # the supervisor gave up on this plan (its folder is gone)
                write_reads(message.reads, reads, why)
    raise RuntimeError("slurm-titan: this node's checkpoint restore failed or was cut short; see the node log")
