"""The scale harness's measure of retry waves (tools/bench/scale_sim/store.py): a rate that climbs over the
seconds (a node's request limit growing back) is not a wave; retries that came back together are; a retry is a request
whose previous one from the same rank for the same part of the same object was refused."""

from __future__ import annotations

import math

from tools.bench.scale_sim import store
from tools.local_s3.throttle_proxy import Request


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


def test_a_retry_is_a_request_whose_previous_one_was_refused() -> None:
    def req(at: float, path: str, status: int, method: str = "PUT", client: str = "") -> Request:
        return Request(at, method, path, status, 0, client)

    part = "/b/a?X-Amz-Signature={}&partNumber={}&uploadId=u"
    requests = [req(0.0, part.format("s1", 1), 503), req(0.1, "/b/b", 200), req(0.2, part.format("s2", 2), 200),
                req(1.2, part.format("s3", 1), 503), req(2.5, part.format("s4", 1), 200), req(3.0, "/b/a", 200, "GET"),
                req(4.0, part.format("s5", 1), 200), req(5.0, "/b/c", 503, "HEAD", "1"),
                req(5.1, "/b/c", 200, "HEAD", "2"), req(5.2, "/b/c", 200, "HEAD", "1")]
    first, retries = store._tries(list(reversed(requests)))
    # another part of the same file, a GET of it, a PUT after a success and another rank's check of an object one
    # was refused are first tries; a retry's presigned URL has a signature of its own
    assert first == [0.0, 0.1, 0.2, 3.0, 4.0, 5.0, 5.1]
    assert retries == [1.2, 2.5, 5.2]
