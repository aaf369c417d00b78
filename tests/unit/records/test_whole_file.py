"""records.whole_file: a file replaced whole, through one descriptor of its folder."""

import os
from pathlib import Path

from slurm_titan.records.whole_file import replace_text


def test_a_file_is_replaced_whole_its_missing_folder_made_and_no_temporary_left(tmp_path: Path) -> None:
    path = tmp_path / "attempts" / "0" / "node-3.json"
    replace_text(path, "first")
    replace_text(path, "second")
    assert path.read_text() == "second" and os.listdir(path.parent) == ["node-3.json"]
