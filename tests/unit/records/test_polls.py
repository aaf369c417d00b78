"""The waits between a node's polls of the job folder (slurm_titan/records/polls.py): growing, spread, and never
shorter than the job's size allows."""

from __future__ import annotations

import itertools
import random

from slurm_titan.records.polls import JOB_LISTINGS_PER_S, poll_waits


def _waits(nodes: int, n: int, first: float = 0.2, cap: float = 1.0, seed: int = 1) -> list[float]:
    return list(itertools.islice(poll_waits(nodes, first, cap, random.Random(seed)), n))


def test_a_small_jobs_waits_grow_from_the_first_to_the_cap_spread_below_them():
    waits = _waits(8, 40)
    assert 0.1 <= waits[0] <= 0.2 and 0.15 <= waits[1] <= 0.3
    assert all(0.5 <= w <= 1.0 for w in waits[5:])  # 0.2 * 1.5**4 > 1: at the cap from the fifth wait
    assert len({round(w, 6) for w in waits[5:]}) == 35  # drawn, not in step with the other nodes'


def test_a_large_jobs_nodes_list_the_folder_no_faster_than_the_jobs_budget():
    nodes = 512
    waits = [w for seed in range(nodes) for w in _waits(nodes, 20, seed=seed)]
    assert min(waits) >= nodes / JOB_LISTINGS_PER_S  # no node more often than its share: the job under the budget
    assert max(waits) <= 2 * nodes / JOB_LISTINGS_PER_S
