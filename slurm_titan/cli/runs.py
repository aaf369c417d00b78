"""`slurm-titan runs`: the newest runs, one line each."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Runs(SubCommand):
    name = "runs"
    help = "recent runs: job, name, state, step, last checkpoint, goodput"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=20, help="how many of the newest runs (default 20)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.launch import runs

        return runs.show(limit=args.limit, as_json=args.json)
