"""Which samples each data-parallel rank reads, and what is left of them after a checkpoint (torch-free).

A rank's *plan* is a list of :class:`Piece`: runs of positions in the sample order of one contiguous
shard of the dataset. A fresh plan for rank ``r`` of ``D`` is exactly torchtitan's
(``datasets.distributed.split_dataset_by_node`` on a map-style dataset: ``Dataset.shard(D, r,
contiguous=True)``, reshuffled per epoch with seed ``42 + epoch`` by ``HuggingFaceTextDataset.reloop``),
so on an unchanged data-parallel degree the resharding loader reads what torchtitan's reads.

A rank's cursor is ``(first, offset)``: plan position ``first`` is the oldest sample with tokens
still in the token buffer (or the next one to read), ``offset`` how many of its tokens were already
yielded. Everything before ``first`` was consumed; from there on nothing was. On resume with another
degree, the ranks' remainders are concatenated in rank order and split contiguously again
(:func:`reshard`): every unconsumed sample lands on exactly one new rank, a cut sample goes on at its
token offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from slurm_titan.errors import SlurmTitanError

SHUFFLE_SEED = 42
"""torchtitan's per-epoch reshuffle seed base (``HuggingFaceTextDataset.reloop``: ``42 + epoch``)."""


class DataResumeError(SlurmTitanError):
    """The data loader cannot continue from this checkpoint as asked (one line; nothing is changed)."""


@dataclass(frozen=True)
class Piece:
    """Positions ``begin..end-1`` of the sample order of shard ``shard`` of ``shards`` in ``epoch``, where the
    shards split the first ``rows`` rows contiguously. ``offset``: tokens of the sample at ``begin`` already
    consumed (0 for every other sample of the piece)."""

    rows: int
    shards: int
    shard: int
    epoch: int
    begin: int
    end: int
    offset: int = 0

    def __len__(self) -> int:
        return self.end - self.begin

    def as_tuple(self) -> tuple[int, ...]:
        return (self.rows, self.shards, self.shard, self.epoch, self.begin, self.end, self.offset)


def shard_bounds(rows: int, shards: int, shard: int) -> tuple[int, int]:
    """Row range of contiguous shard ``shard`` of ``shards`` over ``rows`` rows (``datasets.Dataset.shard``'s
    formula: the first ``rows % shards`` shards get one row more)."""
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards} does not exist")
    div, mod = divmod(rows, shards)
    start = div * shard + min(shard, mod)
    return start, start + div + (1 if shard < mod else 0)


def fresh_plan(rows: int, shards: int, shard: int, epoch: int) -> list[Piece]:
    """The whole shard for one epoch: what torchtitan's loader reads on that rank."""
    start, stop = shard_bounds(rows, shards, shard)
    return [Piece(rows, shards, shard, epoch, 0, stop - start)] if stop > start else []


def plan_length(plan: Sequence[Piece]) -> int:
    return sum(len(p) for p in plan)


def locate(plan: Sequence[Piece], position: int) -> tuple[int, int]:
    """(index of the piece, position inside it) of plan position ``position``; (len(plan), 0) at the end."""
    if position < 0:
        raise ValueError(f"negative plan position {position}")
    for index, piece in enumerate(plan):
        if position < len(piece):
            return index, position
        position -= len(piece)
    if position:
        raise ValueError(f"plan position past the end of the plan by {position}")
    return len(plan), 0


def remaining(plan: Sequence[Piece], first: int, offset: int | None = None) -> list[Piece]:
    """The pieces from plan position ``first`` on; the sample at ``first`` goes on at token ``offset``
    (None: the plan's own offset there, i.e. nothing of it was read)."""
    index, inside = locate(plan, first)
    if index == len(plan):
        return []
    head = plan[index]
    natural = head.offset if inside == 0 else 0
    cut = replace(head, begin=head.begin + inside, offset=natural if offset is None else offset)
    return [cut, *plan[index + 1:]]


def take(pieces: Sequence[Piece], start: int, stop: int) -> list[Piece]:
    """Plan positions ``start..stop-1`` of the concatenation of ``pieces`` (offsets kept where a piece's
    own first sample is included, 0 where a piece is cut into)."""
    out, base = [], 0
    for piece in pieces:
        lo, hi = max(start - base, 0), min(stop - base, len(piece))
        if lo < hi:
            out.append(replace(piece, begin=piece.begin + lo, end=piece.begin + hi,
                               offset=piece.offset if lo == 0 else 0))
        base += len(piece)
    return out


def reshard(remainders: Sequence[Sequence[Piece]], shards: int) -> list[list[Piece]]:
    """Split what the old ranks left (in old-rank order) over ``shards`` new ranks: contiguous runs of the
    concatenation, sizes as :func:`shard_bounds` (differ by one at most)."""
    pieces = [piece for rest in remainders for piece in rest]
    total = plan_length(pieces)
    return [take(pieces, *shard_bounds(total, shards, shard)) for shard in range(shards)]


def base_rows(piece: Piece) -> range:
    """Rows of the shard a piece reads (before the epoch's shuffle)."""
    return range(*shard_bounds(piece.rows, piece.shards, piece.shard))


def epoch0_rows(pieces: Sequence[Piece]) -> Iterator[int]:
    """Global row indices of epoch-0 pieces, in reading order (later epochs are shuffled by datasets)."""
    for piece in pieces:
        if piece.epoch:
            raise ValueError("rows of a shuffled epoch are datasets' permutation; only epoch 0 maps directly")
        yield from base_rows(piece)[piece.begin:piece.end]


def rows_needed(pieces: Sequence[Piece]) -> int:
    """How many dataset rows the pieces need (the end of the furthest shard they read)."""
    return max((base_rows(p).stop for p in pieces if len(p)), default=0)


def pieces_from_tuples(raw: Sequence[Sequence[int]]) -> list[Piece]:
    return [Piece(*map(int, item)) for item in raw]
