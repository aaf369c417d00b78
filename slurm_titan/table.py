"""The plain-text tables of the listings (`runs`, `nodes`, `doctor`, `check-overrides`, `ckpt list`): rows under
a header, each column as wide as its widest cell, two spaces between columns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render(header: Sequence[str], rows: Iterable[Sequence[str]], rule: bool = False) -> str:
    """The header and the rows, left-aligned, as lines without trailing white space (and no final newline).
    `rule` puts a line of dashes under the header. A row of another length than the header is a ValueError."""
    table = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(map(len, column)) for column in zip(*table, strict=True)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in table]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
