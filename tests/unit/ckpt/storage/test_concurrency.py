"""Requests in flight adapt to a throttling store (slurm_titan.ckpt.storage.concurrency): halved once per window
on a throttled answer, one more after each success, between 1 and the configured concurrency; and a paced
client starts them evenly apart, at most its rate."""

from __future__ import annotations

import contextlib
import random
import threading

import pytest

from slurm_titan.ckpt.storage import TransientStoreError
from slurm_titan.ckpt.storage.concurrency import AdaptiveLimit, Pace
from tests.support.fake_clock import FakeClock


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


def test_a_paced_client_starts_its_requests_evenly_apart_the_first_within_one_gap():
    clock = FakeClock()
    pace = Pace(4.0, clock=clock, rng=random.Random(1))  # a turn every 0.25 s
    starts = []
    for _ in range(5):
        pace.wait()
        starts.append(clock.now())
    assert 0.0 <= starts[0] < 0.25
    assert [round(b - a, 9) for a, b in zip(starts, starts[1:])] == [0.25] * 4
    slept = len(clock.sleeps)
    clock.t += 0.4  # a caller slower than the pace waits for nothing
    pace.wait()
    assert len(clock.sleeps) == slept
    slow = clock.now()
    clock.t += 60  # idle for a minute: no burst of the turns it missed, the first again within one gap
    pace.wait()
    again = clock.now()
    pace.wait()
    assert slow + 60 <= again < slow + 60.25 and clock.now() == pytest.approx(again + 0.25)


def test_clients_that_begin_together_take_their_first_turns_apart_at_every_save():
    firsts, nexts = [], []
    for seed in range(200):
        clock = FakeClock()
        pace = Pace(1.0, clock=clock, rng=random.Random(seed))
        pace.wait()
        firsts.append(clock.now())
        clock.t = 100.0  # the next save, after an idle while
        pace.wait()
        nexts.append(clock.now() - 100.0)
    for turns in (firsts, nexts):
        assert min(turns) < 0.05 and max(turns) > 0.95  # spread over the whole gap
        assert sum(f < 0.5 for f in turns) in range(70, 131)


def test_no_rate_means_no_wait_and_threads_each_get_a_turn_of_their_own():
    clock = FakeClock()
    unpaced = Pace(0.0, clock=clock)
    for _ in range(100):
        unpaced.wait()
    assert clock.sleeps == []
    stopped = FakeClock()
    stopped.sleep = stopped.sleeps.append  # type: ignore[method-assign,assignment]  # time stands still
    paced = Pace(10.0, clock=stopped, rng=random.Random(2))
    threads = [threading.Thread(target=paced.wait) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = min(stopped.sleeps)
    assert sorted(stopped.sleeps) == pytest.approx([first + k / 10 for k in range(20)])
