"""A finding of a check as a table row, the table, and the exception that stops a job before training.

A finding is a failure (`FAIL`: the job must not start) or a warning (`WARN`: printed with the failures and in
`--json`, but the preflight passes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_titan import table
from slurm_titan.errors import ExitCode, SlurmTitanError

FAIL = "fail"
WARN = "warn"
_COLUMNS = ("node", "level", "check", "found", "expected")


@dataclass(frozen=True)
class Finding:
    """One check's verdict on one node (`rank (host)`): what was found, what was expected, how bad it is."""

    node: str
    check: str
    found: str
    expected: str
    severity: str = FAIL


def node_rank(finding: Finding) -> int | None:
    """The node rank a finding names (its `node` is `3 (n4)`, or `3` for a silent node); None for another label."""
    head = finding.node.split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def failures(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that fail the preflight (not the warnings)."""
    return [finding for finding in findings if finding.severity == FAIL]


def format_table(findings: list[Finding]) -> str:
    """An aligned plain-text table with a header row, one line per finding."""
    return table.render(_COLUMNS, [(f.node, f.severity, f.check, f.found, f.expected) for f in findings], rule=True)


class PreflightFailed(SlurmTitanError):
    """The preflight found problems; `str()` is a summary line and the table (warnings included).
    Exit code ExitCode.PREFLIGHT."""

    exit_code = ExitCode.PREFLIGHT

    def __init__(self, findings: list[Finding], num_nodes: int) -> None:
        self.findings = findings
        failed = failures(findings)
        nodes = len({f.node for f in failed})
        warned = len(findings) - len(failed)
        super().__init__(f"preflight failed: {len(failed)} problem(s) on {nodes} of {num_nodes} node(s)"
                         f"{f', {warned} warning(s)' if warned else ''}; training not started\n"
                         f"{format_table(findings)}")
