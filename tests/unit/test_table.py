"""`table.render`: columns as wide as their widest cell, two spaces apart, left-aligned, no trailing space."""

import pytest

from slurm_titan.table import render


def test_columns_are_as_wide_as_their_widest_cell_and_left_aligned() -> None:
    assert render(("JOB", "NAME", "STATE"), [("103", "node-lost-running", "UNKNOWN"), ("7", "a", "COMPLETED")]) == (
        "JOB  NAME               STATE\n"
        "103  node-lost-running  UNKNOWN\n"
        "7    a                  COMPLETED")


def test_no_rows_is_the_header_alone_with_its_rule() -> None:
    assert render(("node", "level"), []) == "node  level"
    assert render(("node", "level"), [], rule=True) == "node  level\n----  -----"


def test_a_wide_cell_widens_its_column_and_empty_trailing_cells_leave_no_space() -> None:
    wide = "s3://bucket/a/very/long/prefix/step-30000  (no commit record)"
    assert render(("STEP", "WHERE", "OK"), [("1", wide, ""), ("30000", "-", "ok")], rule=True).splitlines() == [
        "STEP   WHERE" + " " * (len(wide) - 5) + "  OK",
        "-----  " + "-" * len(wide) + "  --",
        "1      " + wide,
        "30000  -" + " " * (len(wide) - 1) + "  ok"]


@pytest.mark.parametrize("rows", [[("x",)], [("x", "y", "z")]])
def test_a_row_longer_or_shorter_than_the_header_is_a_value_error(rows: list[tuple[str, ...]]) -> None:
    with pytest.raises(ValueError):
        render(("a", "b"), rows)
