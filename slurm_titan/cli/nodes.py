"""`slurm-titan nodes`: the node ledger of a cluster."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Nodes(SubCommand):
    name = "nodes"
    help = "the node ledger: failures per node on this cluster, and the nodes new jobs keep off"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cluster", help="another cluster's ledger (default: this cluster's ClusterName)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.records import ledger

        return ledger.show(args.cluster, as_json=args.json)
