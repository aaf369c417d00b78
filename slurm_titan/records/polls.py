"""The waits between one node's polls of the job folder, while every node of the job waits for the others.

A round (the restore's agreement, the RAM tier's holdings, a hang's reports) starts on every node at once, and each
node lists the round's folder until the others have written theirs. A wait's bound grows (1.5x a poll, up to a cap:
a long wait polls less and less), and the wait is drawn within [1/2, 1] of it: nodes that started together do not
list together second after second, and none waits longer than the bound. The bound is never under twice the job's
nodes over ``JOB_LISTINGS_PER_S``, so that no node lists more often than its share of that: the job's M nodes stay
under ``JOB_LISTINGS_PER_S`` listings a second in all (a listing of the shared file system is 4-5 metadata
operations; the scale harness counts them, tools/bench/scale_sim/folder.py). Up to 100 nodes that floor is under the
usual first bound, 0.2 s; at 512 nodes a node's waits are 0.5-1 s from the first.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

JOB_LISTINGS_PER_S = 1000.0
"""The most listings a second that the job's nodes make in all while they wait."""
GROWTH = 1.5


def poll_waits(nodes: int, first: float = 0.2, cap: float = 1.0, rng: random.Random | None = None) -> Iterator[float]:
    """Endless waits for one of ``nodes`` nodes polling at once, each uniform within [1/2, 1] of its bound; the bound
    from ``first``, growing to ``cap``, both at least ``2 * nodes / JOB_LISTINGS_PER_S``."""
    draw = (rng or random).uniform
    floor = 2.0 * nodes / JOB_LISTINGS_PER_S
    bound, cap = max(first, floor), max(cap, floor)
    while True:
        yield draw(bound / 2, bound)
        bound = min(bound * GROWTH, cap)
