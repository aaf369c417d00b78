"""records.held_folder: a folder opened once, its files reached through the descriptor."""

import os
import time
from pathlib import Path

import pytest

from slurm_titan.records.held_folder import HeldFolder


def test_names_in_a_held_folder_made_with_its_parents(tmp_path: Path) -> None:
    with HeldFolder(tmp_path / "attempts" / "0") as folder:
        folder.replace_text("node-1.json", "{}")
        folder.create("node-2.ok")
        folder.create("node-2.ok")  # again: left as it is
        assert sorted(folder.names()) == ["node-1.json", "node-2.ok"]
        assert folder.read_text("node-1.json") == "{}"
        assert folder.stat("missing") is None and folder.stat("node-2.ok").st_size == 0
        claim = folder.create_exclusive("claim")
        assert claim is not None and folder.create_exclusive("claim") is None  # made by another
        os.close(claim)
    assert folder.fd == -1


def test_a_touch_makes_the_file_then_moves_its_time(tmp_path: Path) -> None:
    with HeldFolder(tmp_path) as folder:
        folder.touch("beat")
        os.utime(tmp_path / "beat", (0, 0))
        folder.touch("beat")
        assert (tmp_path / "beat").stat().st_mtime > time.time() - 60


def test_a_sub_folder_is_made_once_and_held_apart(tmp_path: Path) -> None:
    with HeldFolder(tmp_path) as attempt:
        with attempt.sub("restore") as verdicts, attempt.sub("restore") as again:
            verdicts.create("node-0.ok")
            assert again.names() == ["node-0.ok"] and again.path == tmp_path / "restore"
        attempt.replace_text("after", "the parent still held")
    with pytest.raises(NotADirectoryError), HeldFolder(tmp_path) as attempt:
        attempt.sub("after")
