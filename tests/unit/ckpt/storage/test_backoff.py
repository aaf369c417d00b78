"""The storage's retry policy (slurm_titan.ckpt.storage.backoff): full jitter, Retry-After, a deadline for a
throttling store, a few tries for other failures; and the classification of throttled answers it relies on."""

from __future__ import annotations

import errno
import random

import pytest
from botocore.exceptions import ClientError

from slurm_titan import envvars
from slurm_titan.ckpt.storage import Backoff, LocalStore, StoreError, TransientStoreError, Wait
from slurm_titan.ckpt.storage.backoff import WaitNotice
from slurm_titan.ckpt.storage.errors import is_transient, parse_retry_after, retry_after, throttle_code
from slurm_titan.errors import ConfigError
from tests.support.fake_clock import FakeClock


def slow_down(retry_after_s: float | None = None) -> TransientStoreError:
    return TransientStoreError("s3://b/run: cannot read step-3/__0_0.distcp: SlowDown", throttle="SlowDown",
                               retry_after=retry_after_s)


def failing(errors: list[BaseException], then: object = "done"):
    """fn(attempt) raising errors[attempt] while there are some, then returning `then`; counts its calls."""
    calls: list[int] = []

    def fn(attempt: int) -> object:
        calls.append(attempt)
        if attempt < len(errors):
            raise errors[attempt]
        return then

    return fn, calls


def test_a_retry_after_is_honoured():
    clock = FakeClock()
    fn, calls = failing([slow_down(5.0), slow_down(7.0)])
    assert Backoff().run(fn, clock=clock) == "done"
    assert calls == [0, 1, 2]
    assert clock.sleeps[0] >= 5.0 and clock.sleeps[1] >= 7.0


def test_callers_refused_together_come_back_spread_over_a_retry_after_beyond_it():
    """Not all at the Retry-After: a store that refused many callers at once would see them again in one wave."""
    rng = random.Random(1)
    for failures, low, high in ((1, 1.0, 2.0), (9, 1.0, 11.0)):  # the jitter's bound 0.2, then 10 s
        waits = [Backoff(first=0.2, cap=10.0).delay(failures, slow_down(1.0), rng) for _ in range(2000)]
        assert all(low <= w <= high for w in waits)
        assert min(waits) < low + 0.05 * (high - low) and max(waits) > high - 0.05 * (high - low)
        assert 0.45 < sum(w < (low + high) / 2 for w in waits) / len(waits) < 0.55


def test_full_jitter_spreads_the_waits_over_the_whole_interval():
    policy = Backoff(first=0.2, cap=10.0)
    rng = random.Random(1)
    for failures, bound in ((1, 0.2), (4, 1.6), (9, 10.0)):
        waits = [policy.delay(failures, slow_down(), rng) for _ in range(2000)]
        assert all(0 <= w <= bound for w in waits)
        assert min(waits) < 0.05 * bound and max(waits) > 0.95 * bound  # from ~0 up to the bound
        assert len(set(waits)) == len(waits)  # no two alike: callers that failed together come back apart
        below_half = sum(w < bound / 2 for w in waits) / len(waits)
        assert 0.45 < below_half < 0.55  # uniform


def test_ranks_that_fail_together_do_not_retry_in_lockstep():
    first_waits = []
    for rank in range(16):
        clock = FakeClock()
        fn, _ = failing([slow_down()] * 3)
        Backoff().run(fn, clock=clock, rng=random.Random(rank))
        first_waits.append(tuple(clock.sleeps))
    assert len(set(first_waits)) == 16


def test_a_throttling_store_is_waited_out_until_the_deadline_then_named():
    clock = FakeClock()
    fn, calls = failing([slow_down()] * 10_000)
    waits: list[Wait] = []
    with pytest.raises(TransientStoreError) as e:
        Backoff(total=60.0, cap=4.0).run(fn, clock=clock, on_wait=waits.append)
    assert clock.t == pytest.approx(60.0)  # the last wait is cut to the deadline, then one last try
    assert len(calls) > 4  # not a count of tries: the deadline
    msg = str(e.value)
    assert msg.startswith("s3://b/run: cannot read step-3/__0_0.distcp: SlowDown (still refused after 60 s and ")
    assert envvars.STORE_RETRY_S in msg and "\n" not in msg and e.value.throttled
    assert [w.tries for w in waits] == list(range(1, len(calls)))
    assert waits[-1].describe().startswith("the store is throttling (SlowDown): waiting, ")


def test_other_transient_failures_get_a_few_tries_and_the_rest_are_raised_at_once():
    reset = TransientStoreError("s3://b/run: cannot read f: ConnectionResetError: reset")
    fn, calls = failing([reset] * 10)
    with pytest.raises(TransientStoreError, match="reset$"):
        Backoff(tries=4).run(fn, clock=FakeClock())
    assert len(calls) == 4
    fn, calls = failing([StoreError("s3://b/run: f: access denied")])
    with pytest.raises(StoreError, match="access denied"):
        Backoff().run(fn, clock=FakeClock())
    assert calls == [0]
    fn, calls = failing([slow_down(), reset, slow_down(), reset])  # throttled answers do not use up the tries
    assert Backoff(tries=3).run(fn, clock=FakeClock()) == "done"


def test_a_stop_ends_the_wait():
    class Stopped(FakeClock):
        def sleep(self, seconds: float) -> bool:
            return True

    fn, calls = failing([slow_down()] * 5)
    with pytest.raises(TransientStoreError):
        Backoff(total=float("inf"), tries=None).run(fn, clock=Stopped())
    assert calls == [0]


@pytest.mark.parametrize(("raw", "total"), [("", 1800.0), ("3", 3.0), (" 0.5 ", 0.5), ("0", 0.0)])
def test_the_total_comes_from_the_environment(raw, total):
    assert Backoff.from_env({envvars.STORE_RETRY_S: raw}).total == total


@pytest.mark.parametrize(("raw", "problem"), [("soon", "not a number of seconds: 'soon'"), ("-1", "must be >= 0"),
                                              ("nan", "must be >= 0")])
def test_a_bad_total_is_one_line_naming_the_variable(raw, problem):
    with pytest.raises(ConfigError) as e:
        Backoff.from_env({envvars.STORE_RETRY_S: raw})
    assert str(e.value).startswith(f"environment: {envvars.STORE_RETRY_S}: {problem}")


def test_the_notice_says_throttled_waits_at_most_every_30_s():
    clock, said = FakeClock(), []
    notice = WaitNotice(said.append, every=30.0, clock=clock)
    for t in (0, 10, 29, 31, 45, 62):
        clock.t = float(t)
        notice(Wait(error=slow_down(), tries=1, delay=1.0, used=float(t), total=1800.0))
    notice(Wait(error=TransientStoreError("reset"), tries=1, delay=1.0, used=0.0, total=1800.0))
    assert said == [f"the store is throttling (SlowDown): waiting, {t} s of 1800 s used ({slow_down()})"
                    for t in (0, 31, 62)]


def _client_error(code: str, status: int, headers: dict[str, str]) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "Please reduce your request rate."},
                        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}, "GetObject")


@pytest.mark.parametrize("code", ["SlowDown", "TooManyRequests", "ServiceUnavailable", "503", "429", "Throttling"])
def test_a_throttled_answer_through_botocore_is_transient_with_its_retry_after(code):
    e = _client_error(code, 503, {"retry-after": "2"})
    assert is_transient(e) and throttle_code(e) == code and retry_after(e) == 2.0
    translated = OSError(errno.EBUSY, "Please reduce your request rate.")  # what s3fs raises for it
    translated.__cause__ = e
    assert is_transient(translated) and throttle_code(translated) == code and retry_after(translated) == 2.0


def test_other_answers_are_not_throttling():
    assert throttle_code(_client_error("InternalError", 500, {})) == ""
    assert throttle_code(_client_error("AccessDenied", 403, {})) == ""
    assert retry_after(_client_error("SlowDown", 503, {})) is None


def test_retry_after_headers_parse():
    assert parse_retry_after("3") == 3.0 and parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now


def test_what_s3fs_raises_for_slowdown_is_a_throttled_answer_of_the_store(tmp_path):
    # s3fs raises OSError(EBUSY) for SlowDown with no ClientError behind it: a rank opening its location at 30%
    # SlowDown crashed on it (it was transient but not throttled, so no wait)
    error = LocalStore(str(tmp_path), str(tmp_path))._error("cannot open the checkpoint location",
                                             OSError(errno.EBUSY, "Please reduce your request rate."))
    assert isinstance(error, TransientStoreError) and error.throttle == "SlowDown"
