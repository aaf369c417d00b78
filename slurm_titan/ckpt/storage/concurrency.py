"""How many requests a store's client keeps in flight, adapted to the store's answers (AIMD), and how fast it
starts them.

A restore (or an upload) runs up to ``TransferConfig.concurrency`` requests at once. When the store
throttles, that many requests retrying at once keep it over its budget, so each request runs in a slot
of an :class:`AdaptiveLimit`: the limit halves when a request is throttled (once per window: answers
to requests that were sent before the last halving halve it no further) and grows back by one with
each request that succeeds, up to the configured concurrency.

A limit on requests in flight is no limit on their rate: a store that answers at once (a refusal takes a
millisecond) sees as many requests a second as the client can send. An upload's requests are also paced
(:class:`Pace`, ``TransferConfig.upload_rate``): a rank takes its even share of the job's budget
(``checkpoint.upload_rate``, S3's 3,500 writes a second per prefix) and starts its requests evenly apart,
the first at a random moment within its gap, so that the ranks of a save, which all begin at once, neither
send all their first requests together nor come back together after one refusal.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

from slurm_titan.ckpt.storage.backoff import SYSTEM_CLOCK, Clock
from slurm_titan.ckpt.storage.errors import throttle_code


class AdaptiveLimit:
    """Slots for requests: between 1 and ``most`` at once (see the module's docstring). Thread-safe."""

    def __init__(self, most: int) -> None:
        self.most = max(1, most)
        self.limit = self.most
        self.active = 0
        self.window = 0
        """Bumped at each halving."""
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot while the block runs (waiting for one first); its outcome adapts the limit."""
        with self.cond:
            while self.active >= self.limit:
                self.cond.wait()
            self.active += 1
            window = self.window
        ok = throttled = False
        try:
            yield
            ok = True
        except BaseException as e:
            throttled = bool(throttle_code(e))
            raise
        finally:
            with self.cond:
                self.active -= 1
                if throttled and window == self.window:
                    self.limit = max(1, self.limit // 2)
                    self.window += 1
                elif ok and self.limit < self.most:
                    self.limit += 1
                self.cond.notify_all()


IDLE_S = 10.0
"""A pace asked nothing for this long is idle: its next ask (the next save's first) starts afresh."""


class Pace:
    """Turns to start requests, at most ``rate`` a second (0: no pacing), evenly apart: no burst, not even after
    an idle while, and no wait for a caller slower than the pace; the first turn, and the first after ``IDLE_S`` of
    no asks (the next save's), is at a random moment within one gap of its ask, so that clients that begin together
    (every rank's save) take their turns apart. Thread-safe."""

    def __init__(self, rate: float, *, clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        self.gap = 1.0 / rate if rate > 0 else 0.0
        self.clock = clock
        self.rng = rng or random.Random()
        self.next: float | None = None
        """When the next turn is (None: before the first ask)."""
        self.asked = 0.0
        """When the last ask came."""
        self.lock = threading.Lock()

    def wait(self) -> None:
        """Wait for this caller's turn."""
        if not self.gap:
            return
        with self.lock:
            now = self.clock.now()
            if self.next is None or (self.next < now and now - self.asked > IDLE_S):
                self.next = now + self.rng.uniform(0.0, self.gap)
            self.asked = now
            turn = max(now, self.next)
            self.next = turn + self.gap
        if turn > now:
            self.clock.sleep(turn - now)
