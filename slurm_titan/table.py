"""The plain-text tables of the listings (`runs`, `nodes`, `doctor`, `check-overrides`, `ckpt list`): rows under
a header, each column as wide as its widest cell, two spaces between columns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "", rule: bool = False) -> str:
    """The header and the rows as lines without trailing white space (and no final newline).

    `align` holds one `format` alignment a column (`<` left, `>` right, `^` centred); the columns past its end are
    left-aligned. `rule` puts a line of dashes under the header. A row of another length is a ValueError.
    """
    table = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(map(len, column)) for column in zip(*table, strict=True)]
    specs = [f"{how}{width}" for how, width in zip(align.ljust(len(widths), "<"), widths, strict=True)]
    lines = ["  ".join(format(cell, spec) for cell, spec in zip(row, specs, strict=True)).rstrip() for row in table]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
