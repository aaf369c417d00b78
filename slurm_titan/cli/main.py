"""`slurm-titan`: submit torchtitan jobs to Slurm and look after them.

Light by design: nothing here imports torch or torchtitan, so the login-node commands answer
in well under a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from slurm_titan import __version__
from slurm_titan.cli.base import SubCommand, add_subcommands, run_chosen
from slurm_titan.cli.cancel import Cancel
from slurm_titan.cli.check_overrides import CheckOverrides
from slurm_titan.cli.ckpt import Ckpt
from slurm_titan.cli.data import Data
from slurm_titan.cli.doctor import Doctor
from slurm_titan.cli.logs import Logs
from slurm_titan.cli.nodes import Nodes
from slurm_titan.cli.report import Report
from slurm_titan.cli.runs import Runs
from slurm_titan.cli.status import Status
from slurm_titan.cli.submit import Submit
from slurm_titan.errors import SlurmTitanError

COMMANDS: tuple[SubCommand, ...] = (Submit(), Status(), Runs(), Report(), Logs(), Nodes(), Cancel(), Ckpt(),
                                    Data(), Doctor(), CheckOverrides())
"""Every command, in the order `slurm-titan --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurm-titan", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slurm-titan {__version__}")
    add_subcommands(parser, COMMANDS, dest="command")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The one entry: a SlurmTitanError becomes one line on stderr and its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return run_chosen(COMMANDS, args.command, args)
    except SlurmTitanError as error:
        print(f"slurm-titan: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
