"""The resharding data loader's assignment and cursor maths (slurm_titan.data.cursor, torch-free)."""

from __future__ import annotations

import random

import pytest

from slurm_titan.data.cursor import (
    Piece,
    epoch0_rows,
    fresh_plan,
    plan_length,
    remaining,
    reshard,
    rows_needed,
    shard_bounds,
)


@pytest.mark.parametrize("rows", [0, 1, 7, 100, 101])
@pytest.mark.parametrize("shards", [1, 2, 3, 4, 8])
def test_shards_are_datasets_contiguous_split(rows: int, shards: int) -> None:
    bounds = [shard_bounds(rows, shards, s) for s in range(shards)]
    assert [r for lo, hi in bounds for r in range(lo, hi)] == list(range(rows))
    div, mod = divmod(rows, shards)  # datasets.Dataset.shard(contiguous=True), arrow_dataset.py
    assert [hi - lo for lo, hi in bounds] == [div + (1 if s < mod else 0) for s in range(shards)]


def test_shard_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="shard 2 of 2"):
        shard_bounds(10, 2, 2)


def test_remaining_keeps_the_cut_samples_offset() -> None:
    plan = fresh_plan(10, 2, 1, 0)  # rows 5..9
    rest = remaining(plan, 2, 7)
    assert rest == [Piece(10, 2, 1, 0, 2, 5, 7)]
    assert list(epoch0_rows(rest)) == [7, 8, 9]
    assert remaining(plan, 5) == []
    assert remaining(rest, 0) == rest  # None: the plan's own offset
    assert remaining(rest, 1) == [Piece(10, 2, 1, 0, 3, 5, 0)]


def test_cursor_past_the_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="past the end"):
        remaining(fresh_plan(10, 2, 0, 0), 6)


def _cut(rows: int, degree: int, rng: random.Random) -> list[list[Piece]]:
    """Each of `degree` ranks stopped somewhere in its shard, the sample there cut at some token offset."""
    rests = []
    for rank in range(degree):
        plan = fresh_plan(rows, degree, rank, 0)
        first = rng.randint(0, plan_length(plan))
        rests.append(remaining(plan, first, rng.randint(1, 9) if first < plan_length(plan) else None))
    return rests


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 4), (4, 2), (3, 5), (4, 4)])
def test_reshard_gives_every_unconsumed_sample_to_exactly_one_rank(old: int, new: int) -> None:
    rng = random.Random(old * 10 + new)
    for rows in (0, 1, 13, 101):
        rests = _cut(rows, old, rng)
        split = reshard(rests, new)
        assert len(split) == new
        assert sorted(r for plan in split for r in epoch0_rows(plan)) == \
            sorted(r for rest in rests for r in epoch0_rows(rest))
        sizes = [plan_length(p) for p in split]
        assert max(sizes) - min(sizes) <= 1
        cut = {next(epoch0_rows([p])): p.offset for rest in rests for p in rest[:1] if len(p)}
        carried = {next(epoch0_rows([p])): p.offset for plan in split for p in plan if p.offset}
        assert carried == {row: offset for row, offset in cut.items() if offset}


def test_reshard_twice_keeps_the_remainder_and_rows_needed() -> None:
    rng = random.Random(5)
    rests = _cut(50, 2, rng)
    again = reshard([remaining(p, 1) for p in reshard(rests, 3)], 4)
    before = [r for rest in rests for r in epoch0_rows(rest)]
    after = [r for plan in again for r in epoch0_rows(plan)]
    assert set(after) <= set(before) and len(after) == len(set(after)) == len(before) - 3
    assert rows_needed([p for plan in again for p in plan]) <= 50
    assert rows_needed([]) == 0


def test_shuffled_epochs_do_not_map_to_rows_here() -> None:
    with pytest.raises(ValueError, match="permutation"):
        list(epoch0_rows(fresh_plan(10, 1, 0, 1)))
