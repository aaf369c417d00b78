"""`slurm-titan cancel JOB`."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Cancel(SubCommand):
    name = "cancel"
    help = "cancel a job that has not ended (exit 3 for an unknown or ended job)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="job id")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan import slurm

        before = slurm.cancel(args.job)
        print(f"cancelled job {args.job} ({before.state})")
        return 0
