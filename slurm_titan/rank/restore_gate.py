"""In a rank: wait at the gate for the node's checkpoint restore, and take its verdict.

The supervisor starts the ranks first and restores while they import torch and build the model
(node.restore); each rank's checkpoint hook waits here, at a pipe from the supervisor (envvars.RESTORE_FD),
before torchtitan looks at the checkpoint folder.
"""

from __future__ import annotations

import os

from slurm_titan import envvars
from slurm_titan.records.restore_verdict import RestoreVerdict


def wait_for_restore() -> RestoreVerdict | None:
    """Block until the node's restore is done; returns its verdict, None when the rank was started without
    a restore to wait for. The pipe is read once: a second call returns None. Raises RuntimeError when the
    restore failed or the supervisor went away (the node log says why)."""
    fd = os.environ.pop(envvars.RESTORE_FD, "")
    if not fd:
        return None
    with os.fdopen(int(fd), "rb") as pipe:
        verdict = pipe.read()
    if not verdict:
        raise RuntimeError("slurm-titan: this node's checkpoint restore failed or was cut short; see the node log")
    return RestoreVerdict.from_bytes(verdict)
