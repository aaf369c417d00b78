"""The waits between one node's polls of the job folder, while every node of the job waits for the others.

A round (the restore's agreement, the RAM tier's holdings, a hang's reports) starts on every node at once, and each
node lists the round's folder until the others have written theirs. The waits grow (1.5x a poll, up to a cap: a
long wait polls less and less), are drawn at random around that (so that nodes that started together do not list
together, second after second), and are never shorter than the job's size allows: the M nodes' listings stay near
``JOB_LISTINGS_PER_S`` a second in all (a listing of the shared file system is 4-5 metadata operations; the scale
harness counts them, tools/bench/scale_sim/folder.py). Below 100 nodes that floor is under the usual first wait,
0.2 s; at 512 nodes a node's waits start at 1 s.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

JOB_LISTINGS_PER_S = 500.0
"""The job's nodes' listings a second, in all, that their waits keep to on average (a wait's bound: twice that)."""
GROWTH = 1.5


def poll_waits(nodes: int, first: float = 0.2, cap: float = 1.0, rng: random.Random | None = None) -> Iterator[float]:
    """Endless waits for one of ``nodes`` nodes polling at once: from ``first``, growing to ``cap``, both at least
    ``nodes / JOB_LISTINGS_PER_S``; each drawn uniform within [0.5, 1.5] of that."""
    draw = (rng or random).uniform
    floor = nodes / JOB_LISTINGS_PER_S
    wait, cap = max(first, floor), max(cap, floor)
    while True:
        yield wait * draw(0.5, 1.5)
        wait = min(wait * GROWTH, cap)
