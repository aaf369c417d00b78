"""`slurm-titan logs JOB`: a job's node logs, one rank's log, or the stacks the watchdog took on a hang."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Logs(SubCommand):
    name = "logs"
    help = "show a job's logs"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="job id")
        parser.add_argument("--rank", type=int, help="one training rank's log (default: the node logs)")
        parser.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
        parser.add_argument("--stacks", action="store_true",
                            help="the ranks' stacks the watchdog took on a hang (newest attempt that has them)")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.launch import logs

        if args.stacks:
            return logs.show_stacks(args.job)
        return logs.show(args.job, rank=args.rank, follow=args.follow)
