"""The rank's half of the watchdog's stack dumps: the faulthandler fallback (node.supervisor.stacks takes the dumps)."""

from __future__ import annotations

import faulthandler
import os

from slurm_titan import envvars
from slurm_titan.signals import DUMP_SIGNAL


def register_in_rank() -> None:
    """In the rank, before torch is imported: dump every thread's stack into the file the supervisor
    named when DUMP_SIGNAL comes (the fallback for nodes without a working py-spy)."""
    if path := os.environ.get(envvars.STACK_FILE):
        faulthandler.register(DUMP_SIGNAL, file=open(path, "w"), all_threads=True, chain=False)  # noqa: SIM115
