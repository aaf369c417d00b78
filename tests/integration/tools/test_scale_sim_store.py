"""The scale harness's store part (tools/bench/scale_sim/store.py) at 16 ranks, as a correctness test: the real
uploaders, committer, node restores with their agreement, list and prune, through the throttling proxy in front of
SeaweedFS. Outcomes and counts are checked, never durations (the harness's timed figures are the benchmark's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.s3 import weed_available
from tools.bench.llama3_70b import rank_files
from tools.bench.scale_sim import store

pytestmark = [pytest.mark.s3, pytest.mark.skipif(not weed_available(), reason="SeaweedFS 'weed' binary missing")]


def test_16_ranks_save_commit_restore_list_and_prune_through_a_throttling_store(tmp_path: Path) -> None:
    # 1 MiB parts: each rank's 12.9 MB file in 13 (the sweep cuts as many parts as the real files, ~50,000 a save);
    # the store holds none of the files' bytes (`--discard`): the proxies answer for their zeros, and every read,
    # size and checksum of the commit and the restores is as the store's would be
    row = store.measure(16, tmp_path, throttled_s=3.0, part_size=1 << 20, discard=True)  # list and prune inside
    _, sizes = rank_files(16, store.SCALE)
    assert row["save_parts"] == sum(-(-size // (1 << 20)) for size in sizes)  # every part PUT once, unthrottled
    assert row["save_throttled"] > 0  # the throttled save was refused, and retried
    assert row["save_retries"] > 0  # and the harness counts the retries (a request for the same part of an object)
    assert row["save_bytes_ratio"] <= 1.1  # a refused request's body is not sent again and again
    assert row["receipt_gets_per_rank"] <= 3  # a receipt is read once (twice if rewritten meanwhile), not a poll
    assert row["stale_requests"] == 0  # an earlier attempt's receipts for the step: never listed, never read
    assert row["restore_extra_gets"] <= 16  # a node's GETs beyond its own ranks' files
    assert row["restore_requests"] >= row["save_parts"]  # each file fetched in ranges as it was cut into parts
    assert row["budget_restored"] == 1  # every node restored at twice the store's budget
    assert row["refusal_named"] == 1  # a store refusing beyond the retry budget: the object and its answer named
    assert row["files_discarded"] == 16  # the kept step's files, written empty (the pruned step's forgotten)
