"""llama3 70B with AdamW as DCP saves it on N ranks: the files' items and sizes that the scale benchmarks
(tools/bench/scale_record.py, tools/bench/scale_sim/) give their synthetic ranks.

723 parameters (80 layers of wq, wk, wv, wo, w1, w2, w3 and two norms; embeddings, output, final norm), each saved
as weight and two AdamW moments (fp32, sharded over all N ranks on dim 0: 2,169 items per rank, 847 GB in all),
plus 725 replicated 8-byte items (AdamW's step per parameter and train state) that DCP's dedup spreads over the
ranks' files, at the head of each.
"""

from __future__ import annotations

MiB = 1 << 20
BLOCK = 16 * MiB
"""The record's block (and a fetch's part) size."""
RANKS_PER_NODE = 8
REPLICATED = 725

Item = tuple[int, int, bool]
"""(offset, length, replicated) of one item in a rank's file."""


def params() -> list[int]:
    """Element counts of llama3 70B's 723 parameters."""
    dim, kv, ffn, vocab = 8192, 1024, 28672, 128256
    layer = [dim * dim, kv * dim, kv * dim, dim * dim, ffn * dim, dim * ffn, ffn * dim, dim, dim]
    return [vocab * dim] + layer * 80 + [dim, vocab * dim]


def rank_files(n: int, scale: int) -> tuple[list[list[Item]], list[int]]:
    """Per rank of ``n``, its file's items, replicated ones first, then sharded ones largest first (as DCP lays
    them out); and each file's size. ``scale``: sizes divided by it (the same item counts)."""
    sharded = sorted((max(1, -(-4 * p // (n * scale))) for p in params() for _ in range(3)), reverse=True)
    out, sizes = [], []
    for r in range(n):
        items, off = [], 0
        for _ in range(r, REPLICATED, n):
            items.append((off, 8, True))
            off += 8
        for length in sharded:
            items.append((off, length, False))
            off += length
        out.append(items)
        sizes.append(off)
    return out, sizes


def file_name(rank: int) -> str:
    """A rank's file in the step folder (torch's writer with one thread a rank)."""
    return f"__{rank}_0.distcp"


def heads(items: list[list[Item]]) -> list[int]:
    """The bytes of replicated items at the head of each rank's file (what every other rank's load reads of it)."""
    return [sum(length for _, length, rep in its if rep) for its in items]


def reads(n: int, rank: int, heads: list[int], sizes: list[int]) -> list[tuple[str, int, int]]:
    """What ``rank``'s load reads: its own file whole and the replicated items at the head of every other file
    (``heads``: :func:`heads`, worked out once for all ranks)."""
    return [(file_name(rank), 0, sizes[rank])] + [(file_name(k), 0, heads[k]) for k in range(n)
                                                  if k != rank and heads[k]]
