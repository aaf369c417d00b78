"""The scale harness's measure of retry waves (tools/bench/scale_sim/store.py): a rate that climbs over the
seconds (a node's request limit growing back) is not a wave; retries that came back together are."""

from __future__ import annotations

import math

from tools.bench.scale_sim import store


def _climbing(n: int = 6000, span: float = 10.0) -> list[float]:
    """``n`` times over ``span`` seconds at a rate that climbs evenly from 0 (the k-th at span * sqrt(k / n))."""
    return [span * math.sqrt(k / n) for k in range(1, n)]


def test_a_climbing_rate_is_not_a_wave() -> None:
    times = _climbing()
    assert store._peak_ratio(times, 10.0) > 1.9  # against the whole span's mean, the last second stands out
    assert store._wave_ratio(times, 10.0) < 1.2


def test_retries_that_come_back_together_are_a_wave() -> None:
    times = sorted(_climbing() + [5.03 + k * 1e-4 for k in range(300)])  # 300 in one 100 ms, at ~60 each
    assert store._wave_ratio(times, 10.0) > 3


def test_chance_is_the_median_of_uniform_draws_over_the_span() -> None:
    times = _climbing(2000)
    assert 1.0 < store._chance(store._wave_ratio, times, 10.0) < store._chance(store._peak_ratio, times, 10.0) < 2.0
