"""The debug assets are written whole or not at all: jobs submitted at once (one per test worker) never read a
half-written tokenizer or dataset."""

from pathlib import Path

from slurm_titan.launch import debug_assets
from slurm_titan.launch.debug_assets import DATASET_FILE, ensure_assets, write_dataset


def test_an_incomplete_folder_is_replaced_and_a_complete_one_kept(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{half")  # a writer killed half-way
    monkeypatch.setattr(debug_assets, "write_tokenizer", lambda folder: _files(folder, "tokenizer.json",
                                                                              "tokenizer_config.json"))
    tokenizer, dataset = ensure_assets(tmp_path)
    assert (tokenizer / "tokenizer.json").read_text() == "whole"
    assert (dataset / DATASET_FILE).stat().st_size > 0
    before = (dataset / DATASET_FILE).stat().st_mtime_ns
    ensure_assets(tmp_path)
    assert (dataset / DATASET_FILE).stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "tokenizer"]  # no temporary folder left


def test_a_writer_that_lost_the_race_leaves_the_winners_folder(tmp_path: Path, monkeypatch) -> None:
    def slow_writer(folder: Path) -> Path:  # another process renames its complete folder meanwhile
        write_dataset(tmp_path / "dataset", documents=3)
        return write_dataset(folder, documents=5)

    monkeypatch.setattr(debug_assets, "write_dataset", slow_writer)
    monkeypatch.setattr(debug_assets, "write_tokenizer", lambda folder: _files(folder, "tokenizer.json",
                                                                              "tokenizer_config.json"))
    ensure_assets(tmp_path)
    assert len((tmp_path / "dataset" / DATASET_FILE).read_text().splitlines()) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "tokenizer"]


def _files(folder: Path, *names: str) -> Path:
    for name in names:
        (folder / name).write_text("whole")
    return folder
