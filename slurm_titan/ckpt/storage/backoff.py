"""Retrying store operations: full-jitter exponential backoff within a deadline, and what a wait says.

One :class:`Backoff` for every retry loop of the checkpoint storage (a request of the S3 fast path,
a small object, a range of a restore; the uploader's loop over a rank's files):

- **full jitter**: the wait after the n-th failure is uniform in [0, min(cap, first * 2**(n-1))], so that
  ranks and threads that failed together do not come back together;
- **Retry-After**: a wait is never shorter than what the store asked for, and is spread over as long again
  beyond it (or over the jitter's bound, if longer): callers refused together do not all come back at the same
  Retry-After, in waves (measured in the scale harness: tools/bench/scale_sim/store.py);
- **a deadline, not only a count**: a throttled answer (the store is up and asks for fewer requests:
  503 SlowDown, 429) is retried until ``total`` seconds have passed since the first try
  (SLURM_TITAN_STORE_RETRY_S, default 1800); any other transient failure (unreachable, reset, timed
  out) at most ``tries`` times, within the same deadline;
- **said**: each wait goes to ``on_wait``; :class:`WaitNotice` turns the throttled ones of many
  concurrent operations into one line at most every 30 s ("the store is throttling (SlowDown):
  waiting, 12 s of 1800 s used ...").

When the deadline is used up, the last failure is raised, saying for how long the store refused.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from slurm_titan import envvars
from slurm_titan.ckpt.storage.errors import TransientStoreError, is_transient, retry_after, throttle_code
from slurm_titan.errors import ConfigError

T = TypeVar("T")

DEFAULT_TOTAL_S = 1800.0
"""How long an operation waits out a throttling store by default (SLURM_TITAN_STORE_RETRY_S)."""

_rng = random.Random()


class Clock(Protocol):
    """Time for a retry loop (tests pass a fake one)."""

    def now(self) -> float:
        """Seconds, monotonic."""
        ...

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; True when woken early to give up (a stop event)."""
        ...


@dataclass(frozen=True)
class SystemClock:
    """time.monotonic; sleeps end early, to give up, when ``stop`` is set."""

    stop: threading.Event | None = None

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> bool:
        if self.stop is None:
            time.sleep(seconds)
            return False
        return self.stop.wait(seconds)


SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True, kw_only=True)
class Wait:
    """One wait of a retry loop, as ``on_wait`` gets it."""

    error: BaseException
    """The failure that is waited out."""
    tries: int
    """Tries so far."""
    delay: float
    """Seconds about to be waited."""
    used: float
    """Seconds since the first try."""
    total: float
    """The operation's deadline, in seconds from the first try."""

    @property
    def throttled(self) -> bool:
        return bool(throttle_code(self.error))

    def describe(self) -> str:
        """One line for a log."""
        code = throttle_code(self.error)
        if code:
            return (f"the store is throttling ({code}): waiting, {self.used:.0f} s of {self.total:.0f} s used "
                    f"({self.error})")
        return f"the store failed (try {self.tries}), retrying in {self.delay:.1f} s: {self.error}"


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How an operation is retried (see the module's docstring)."""

    total: float = DEFAULT_TOTAL_S
    """Seconds from the first try after which an operation is not tried again."""
    tries: int | None = 4
    """Tries of an operation whose failures are not throttling (None: no limit but ``total``). The store
    gives operations through a library that retries those itself (gcsfs; s3fs inside a file it streams) one try."""
    first: float = 0.2
    """The first wait is at most this long; each later one's bound is twice the one before, up to ``cap``."""
    cap: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Backoff:
        """The default policy, ``total`` from SLURM_TITAN_STORE_RETRY_S; ConfigError (one line) if malformed."""
        raw = env.get(envvars.STORE_RETRY_S, "").strip()
        if not raw:
            return cls()
        try:
            total = float(raw)
        except ValueError:
            raise ConfigError("environment", envvars.STORE_RETRY_S, f"not a number of seconds: {raw!r}") from None
        if not total >= 0:
            raise ConfigError("environment", envvars.STORE_RETRY_S, f"must be >= 0, got {raw}")
        return cls(total=total)

    def delay(self, failures: int, error: BaseException, rng: random.Random) -> float:
        """The wait after the ``failures``-th failure, ``error``: full jitter; with a Retry-After, that plus full
        jitter over as long again (or the bound, if longer)."""
        bound = min(self.cap, self.first * 2.0 ** min(failures - 1, 64))
        asked = retry_after(error) or 0.0
        return asked + rng.uniform(0.0, max(bound, asked)) if asked else rng.uniform(0.0, bound)

    def run(self, fn: Callable[[int], T], *, on_wait: Callable[[Wait], None] | None = None,
            retryable: Callable[[BaseException], bool] = is_transient, clock: Clock = SYSTEM_CLOCK,
            rng: random.Random | None = None) -> T:
        """``fn(attempt)`` (0, 1, ...) until it returns; failures that are not ``retryable`` are raised at
        once, the others after the policy's tries or deadline (or when ``clock.sleep`` is woken early)."""
        rng = rng or _rng
        began = clock.now()
        others = 0
        attempt = -1
        last = False  # the try at the deadline
        while True:
            attempt += 1
            try:
                return fn(attempt)
            except Exception as e:  # noqa: BLE001 - `retryable` decides
                if not retryable(e):
                    raise
                throttled = bool(throttle_code(e))
                others += not throttled
                used = clock.now() - began
                if self.tries is not None and others >= self.tries:
                    raise
                if last or used >= self.total:
                    if throttled and isinstance(e, TransientStoreError):
                        raise e.reworded(f"{e} (still refused after {used:.0f} s and {attempt + 1} tries; "
                                         f"{envvars.STORE_RETRY_S}={self.total:g})") from None
                    raise
                delay = self.delay(attempt + 1, e, rng)
                if delay >= self.total - used:
                    delay, last = self.total - used, True
                if on_wait is not None:
                    on_wait(Wait(error=e, tries=attempt + 1, delay=delay, used=used, total=self.total))
                if clock.sleep(delay):
                    raise


class WaitNotice:
    """The throttled waits of many concurrent operations as one line at most every ``every`` seconds, to
    ``say`` (the node log, a logger); other waits (brief: a few tries) are not said."""

    def __init__(self, say: Callable[[str], None], every: float = 30.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.say, self.every, self.clock = say, every, clock
        self.last: float | None = None
        self.lock = threading.Lock()

    def __call__(self, wait: Wait) -> None:
        if not wait.throttled:
            return
        now = self.clock.now()
        with self.lock:
            if self.last is not None and now - self.last < self.every:
                return
            self.last = now
        self.say(wait.describe())
