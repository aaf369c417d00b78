"""A clock for the store's retry loops and pacing (slurm_titan.ckpt.storage.backoff.Clock) whose time passes only
when slept on."""

from __future__ import annotations


class FakeClock:
    """Time that passes only when slept; records the sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> bool:
        self.sleeps.append(seconds)
        self.t += seconds
        return False
