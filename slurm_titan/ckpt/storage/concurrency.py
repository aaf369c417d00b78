"""How many requests a store's client keeps in flight, adapted to the store's answers (AIMD).

A restore (or an upload) runs up to ``TransferConfig.concurrency`` requests at once. When the store
throttles, that many requests retrying at once keep it over its budget, so each request runs in a slot
of an :class:`AdaptiveLimit`: the limit halves when a request is throttled (once per window: answers
to requests that were sent before the last halving halve it no further) and grows back by one with
each request that succeeds, up to the configured concurrency.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

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
