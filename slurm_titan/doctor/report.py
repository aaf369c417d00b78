"""A failed check as a table row, the table, and the exception that stops a job before training."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_titan.errors import SlurmTitanError
from slurm_titan.node.outcome import PREFLIGHT_EXIT_CODE

_COLUMNS = ("node", "check", "found", "expected")


@dataclass(frozen=True)
class Failure:
    """One failed check: on which node (`rank (host)`), what was found, what was expected."""

    node: str
    check: str
    found: str
    expected: str


def format_table(failures: list[Failure]) -> str:
    """An aligned plain-text table with a header row, one line per failure."""
    rows = [_COLUMNS, *((f.node, f.check, f.found, f.expected) for f in failures)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


class PreflightFailed(SlurmTitanError):
    """The preflight found problems; `str()` is a summary line and the table. Exit code PREFLIGHT_EXIT_CODE."""

    exit_code = PREFLIGHT_EXIT_CODE

    def __init__(self, failures: list[Failure], num_nodes: int) -> None:
        self.failures = failures
        nodes = len({f.node for f in failures})
        super().__init__(f"preflight failed: {len(failures)} problem(s) on {nodes} of {num_nodes} node(s); "
                         f"training not started\n{format_table(failures)}")
