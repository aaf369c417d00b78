"""Nearby ranges of a file read with one request (slurm_titan.ckpt.storage.range_batches)."""

from slurm_titan.ckpt.storage.range_batches import Batch, batch_ranges


def read(data: dict[str, bytes], items: list[tuple[str, int, int]], **limits: int) -> tuple[list[bytes], int]:
    """What read_ranges returns for `items` of the files `data`, and how many requests it took."""
    out = [b""] * len(items)
    batches = batch_ranges(items, **limits)
    for batch in batches:
        got = data[batch.rel][batch.offset:batch.offset + batch.length]
        for index, start, n in batch.members:
            out[index] = got[start:start + n]
    return out, len(batches)


def test_the_spans_at_the_heads_of_two_files_take_one_request_each_and_come_back_in_order() -> None:
    data = {"a": bytes(range(256)) * 40, "b": bytes(range(255, -1, -1)) * 40}
    items = [("b", 100, 8), ("a", 0, 4), ("a", 4, 4), ("b", 0, 8), ("a", 2000, 16), ("a", 1, 2)]  # overlapping too
    got, requests = read(data, items)
    assert got == [data[rel][off:off + n] for rel, off, n in items]
    assert requests == 2


def test_a_far_range_or_a_full_batch_starts_a_request_of_its_own() -> None:
    data = {"a": bytes(10_000)}
    assert read(data, [("a", 0, 10), ("a", 5000, 10)], max_gap=1000)[1] == 2
    assert read(data, [("a", 0, 10), ("a", 500, 10)], max_gap=1000)[1] == 1
    assert read(data, [("a", 0, 600), ("a", 600, 600), ("a", 1200, 600)], max_bytes=1000)[1] == 3
    assert batch_ranges([("a", 0, 5000)], max_bytes=1000) == [Batch("a", 0, 5000, ((0, 0, 5000),))]  # alone
    assert batch_ranges([]) == []
