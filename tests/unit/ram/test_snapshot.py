"""A rank's snapshot folder: complete only sealed, with its manifest's run, step and sizes; what a node holds."""

from __future__ import annotations

from pathlib import Path

from slurm_titan.ram import layout, snapshot

RUN = "4711:abc"


def seal(root: Path, step: int, rank: int, run: str = RUN, world_size: int = 2) -> Path:
    staging = layout.step_dir(root, step) / f".rank-{rank}.1"
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(b"x" * 64)
    final = layout.rank_dir(root, step, rank)
    snapshot.seal(staging, snapshot.Manifest.of_folder(staging, run=run, step=step, rank=rank,
                                                       world_size=world_size), final)
    return final


def test_holdings_name_the_complete_snapshots_of_this_run_and_world_size_only(tmp_path: Path) -> None:
    seal(tmp_path, 4, 0), seal(tmp_path, 4, 1), seal(tmp_path, 6, 0)
    seal(tmp_path, 6, 1, run="999:other")  # another run's
    seal(tmp_path, 8, 0, world_size=4)  # saved by another world size
    (layout.step_dir(tmp_path, 8) / ".rank-1.77").mkdir()  # a snapshot cut short: never sealed
    assert snapshot.holdings(tmp_path, run=RUN, world_size=2) == {6: [0], 4: [0, 1]}
    assert "a snapshot of another run (999:other" in snapshot.problem(
        layout.rank_dir(tmp_path, 6, 1), run=RUN, step=6, rank=1, world_size=2)
    assert "saved by 4 ranks, not 2" in snapshot.problem(
        layout.rank_dir(tmp_path, 8, 0), run=RUN, step=8, rank=0, world_size=2)


def test_sealing_again_replaces_an_earlier_attempts_folder_and_dropping_keeps_what_is_asked(tmp_path: Path) -> None:
    seal(tmp_path, 4, 0)
    again = layout.step_dir(tmp_path, 4) / ".rank-0.2"
    again.mkdir()
    (again / "__0_0.distcp").write_bytes(b"y" * 10)
    snapshot.seal(again, snapshot.Manifest.of_folder(again, run=RUN, step=4, rank=0, world_size=2),
                  layout.rank_dir(tmp_path, 4, 0))
    assert (layout.rank_dir(tmp_path, 4, 0) / "__0_0.distcp").read_bytes() == b"y" * 10
    seal(tmp_path, 6, 0), seal(tmp_path, 8, 0)
    assert snapshot.drop_steps(tmp_path, {6}) == [4, 8]
    assert layout.steps(tmp_path) == [6]
