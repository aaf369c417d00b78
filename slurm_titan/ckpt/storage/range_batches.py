"""Small ranges of stored files read together: ranges of one file that lie close are fetched with one request.

A committer gathering a checkpoint's small items reads hundreds of spans of a few files, most of them a few
bytes and next to each other at the head of their file. One request per span costs a request each against
the store's budget (and, while the store throttles, a Retry-After each); read as one range per cluster of
nearby spans, the same bytes take a request per file or a few.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_GAP = 1 << 20
"""Bytes between two ranges of one file that are read (and thrown away) rather than paid for with a request."""
MAX_BATCH = 16 << 20
"""The most bytes one batched request reads."""


@dataclass(frozen=True)
class Batch:
    """One request: ``length`` bytes of ``rel`` from ``offset``, holding the wanted ranges ``members``, each
    as (its index in the request list, its offset within the batch, its length)."""

    rel: str
    offset: int
    length: int
    members: tuple[tuple[int, int, int], ...]


def batch_ranges(items: list[tuple[str, int, int]], max_gap: int = MAX_GAP,
                 max_bytes: int = MAX_BATCH) -> list[Batch]:
    """The requests that read every (rel, offset, length) of ``items``: ranges of one file whose gap is at
    most ``max_gap`` share a request while it reads at most ``max_bytes`` (a single larger range is read
    alone). Overlapping ranges share bytes."""
    order = sorted(range(len(items)), key=lambda i: (items[i][0], items[i][1]))
    groups: list[_Group] = []
    for i in order:
        rel, off, n = items[i]
        last = groups[-1] if groups else None
        if (last is not None and last.rel == rel and off <= last.end + max_gap
                and max(last.end, off + n) - last.start <= max_bytes):
            last.end = max(last.end, off + n)
            last.members.append(i)
        else:
            groups.append(_Group(rel, off, off + n, [i]))
    return [Batch(g.rel, g.start, g.end - g.start, tuple((i, items[i][1] - g.start, items[i][2]) for i in g.members))
            for g in groups]


@dataclass
class _Group:
    rel: str
    start: int
    end: int
    members: list[int]
