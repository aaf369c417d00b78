"""In a rank: wait, with torch and torchtitan imported, for the node supervisor's word to train.

The supervisor starts its ranks before its preflight and, in a step the batch shell started ahead
(node.batch.ahead), before the batch shell has decided that the step trains at all: the import (seconds) then
overlaps them. The word is one JSON line on a pipe (envvars.START_FD): the environment settled since the start
(the RAM tier's settings, known after the preflight), applied before torchtitan reads its config. The pipe
closed without a word means the rank is not needed: it exits at once, without a line of its own.
"""

from __future__ import annotations

import json
import os
import sys

from slurm_titan import envvars


def wait_for_word() -> dict[str, str]:
    """Block until the supervisor's word and return its environment; exit 0 when the pipe closes without one. A rank
    started without the pipe goes on at once ({})."""
    fd = os.environ.pop(envvars.START_FD, "")
    if not fd:
        return {}
    with os.fdopen(int(fd), "rb") as pipe:
        line = pipe.readline()
    if not line.strip():
        sys.exit(0)
    return json.loads(line)


def wait_for_start() -> None:
    """:func:`wait_for_word`, its environment taken."""
    os.environ.update(wait_for_word())
