"""`slurm-titan status [JOB]`: the state of a job, or of the recent jobs, across requeues."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Status(SubCommand):
    name = "status"
    help = "state of a job (or of recent jobs), across requeues; of a run, across its jobs"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", nargs="?", help="job id or run name (default: recent jobs)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.launch import status

        return status.show(args.job, as_json=args.json)
