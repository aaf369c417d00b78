"""Requests in flight adapt to a throttling store (slurm_titan.ckpt.storage.concurrency): halved once per window
on a throttled answer, one more after each success, between 1 and the configured concurrency."""

from __future__ import annotations

import contextlib
import threading

from slurm_titan.ckpt.storage import TransientStoreError
from slurm_titan.ckpt.storage.concurrency import AdaptiveLimit


def _answer(limit: AdaptiveLimit, error: BaseException | None) -> None:
    with contextlib.suppress(type(error) if error else ()), limit.slot():
        if error:
            raise error


SLOW_DOWN = TransientStoreError("s3://b/r: cannot read f: SlowDown", throttle="SlowDown")


def test_throttled_answers_halve_the_limit_and_successes_grow_it_back_by_one():
    limit = AdaptiveLimit(8)
    for expected in (4, 2, 1, 1):
        _answer(limit, SLOW_DOWN)
        assert limit.limit == expected
    _answer(limit, TransientStoreError("reset"))  # not throttling: no change
    assert limit.limit == 1
    for expected in (2, 3, 4, 5, 6, 7, 8, 8):
        _answer(limit, None)
        assert limit.limit == expected


def test_answers_to_requests_sent_before_a_halving_halve_no_further():
    limit = AdaptiveLimit(8)
    slots = [limit.slot() for _ in range(8)]
    for s in slots:
        s.__enter__()  # 8 requests in flight, all throttled
    for s in slots:
        assert not s.__exit__(TransientStoreError, SLOW_DOWN, None)  # the failure goes on to the caller
    assert limit.limit == 4 and limit.active == 0


def test_no_more_requests_than_the_limit_run_at_once():
    limit = AdaptiveLimit(8)
    _answer(limit, SLOW_DOWN)
    _answer(limit, SLOW_DOWN)  # 2
    running, most, lock = [0], [0], threading.Lock()
    go = threading.Event()

    def request() -> None:
        with contextlib.suppress(TransientStoreError), limit.slot():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            go.wait(0.05)
            with lock:
                running[0] -= 1
            raise SLOW_DOWN

    threads = [threading.Thread(target=request) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] <= 2 and limit.limit == 1
