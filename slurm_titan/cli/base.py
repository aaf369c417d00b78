"""The one shape of a `slurm-titan` command (as torchx's `cli/cmd_base.py`): its arguments and its run.

A command module imports at its top only what the login node can load in a blink (no torch, no torchtitan);
`run` imports the rest when the command is the one asked for.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar


class SubCommand(ABC):
    """One command: `name` and `help` as the parent's command list shows them, `description` on its own --help."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str | None] = None

    @abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this command's arguments (or its own subcommands) to its parser."""

    @abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do the command; return its exit code, raise SlurmTitanError for a failure the user can act on."""


def add_subcommands(parser: argparse.ArgumentParser, commands: Sequence[SubCommand], dest: str) -> None:
    """Give `parser` one required COMMAND, one of `commands`; the name given lands in `args.<dest>`."""
    subparsers = parser.add_subparsers(dest=dest, required=True, metavar="COMMAND")
    for command in commands:
        command.add_arguments(subparsers.add_parser(command.name, help=command.help,
                                                    description=command.description))


def run_chosen(commands: Sequence[SubCommand], name: str, args: argparse.Namespace) -> int:
    """Run the one of `commands` called `name` (the COMMAND `add_subcommands` parsed)."""
    (command,) = (command for command in commands if command.name == name)
    return command.run(args)
