"""torchtitan's packing of documents into ``seq_len`` sequences, read over a :class:`~slurm_titan.data.cursor.Piece`
plan with an exact cursor: the base of the resharding loader's text dataset and of the token-shard dataset.

Per document, as torchtitan's ``HuggingFaceTextDataset``: inputs and labels shifted by one inside it (a
document boundary is never crossed by a label), positions counted from 0 where its run in a sequence starts
(the per-document mask of the NPU attention and the reference attention). The documents' inputs and labels
are kept as flat arrays (:class:`_Buffer`) and each sequence is a ``seq_len`` window of them, its positions
computed at once: no per-sequence work per document. The buffer knows which plan position and token offset
each of its tokens comes from, which makes the cursor exact: the state is (plan, the oldest document with
tokens not yet yielded, how many of its tokens were, epoch), see :mod:`slurm_titan.data.cursor`.

A subclass says how many documents there are (:attr:`rows`) and reads a piece's documents (:meth:`_read`),
in blocks of consecutive documents, as many at a time as it reads cheaply, and :attr:`read_ahead` says how
many input tokens to read before packing (``seq_len``: read as late as torchtitan reads).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from slurm_titan.data.cursor import Piece, fresh_plan, locate, pieces_from_tuples, remaining

log = logging.getLogger("slurm_titan.overrides.plan_packing")

Sequence = tuple[dict[str, torch.Tensor], torch.Tensor]
"""One packed sequence: ``({"input", "positions"}, labels)``."""

Block = tuple[np.ndarray, np.ndarray]
"""Consecutive documents of a plan: their token ids (BOS .. EOS each) back to back, and each one's length."""


class _Buffer:
    """Inputs and labels of the documents read and not yet yielded, flat, with where each document's run is."""

    def __init__(self) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self.inputs, self.labels, self.starts = empty, empty, np.zeros(0, dtype=bool)
        self.doc_position, self.doc_start, self.doc_end, self.doc_offset = empty, empty, empty, empty
        self.next = 0  # index of the first input token not yet yielded

    @property
    def available(self) -> int:
        return len(self.inputs) - self.next

    def add(self, tokens: np.ndarray, lengths: np.ndarray, first_position: int, first_offset: int) -> None:
        """A block of documents at plan positions ``first_position``..., the first going on at token
        ``first_offset`` (the others from their start): each contributes ``tokens[offset:-1]`` as inputs and
        ``tokens[offset + 1:]`` as labels."""
        self._compact()
        ends = np.cumsum(lengths, dtype=np.int64)
        begins = ends - lengths
        offsets = np.zeros(len(lengths), dtype=np.int64)
        offsets[:1] = first_offset
        counts = np.maximum(lengths - 1 - offsets, 0)
        owner = np.repeat(np.arange(len(lengths)), lengths)
        inside = np.arange(len(tokens)) - begins[owner]
        keep_input = (inside >= offsets[owner]) & (inside < lengths[owner] - 1)
        keep_label = (inside > offsets[owner]) & (inside < lengths[owner])
        starts = np.zeros(int(counts.sum()), dtype=bool)
        run_begins = np.cumsum(counts) - counts
        starts[run_begins[counts > 0]] = True
        base = len(self.inputs)
        self.inputs = np.concatenate((self.inputs, tokens[keep_input].astype(np.int64, copy=False)))
        self.labels = np.concatenate((self.labels, tokens[keep_label].astype(np.int64, copy=False)))
        self.starts = np.concatenate((self.starts, starts))
        self.doc_position = np.concatenate((self.doc_position, first_position + np.arange(len(lengths))))
        self.doc_start = np.concatenate((self.doc_start, base + run_begins))
        self.doc_end = np.concatenate((self.doc_end, base + run_begins + counts))
        self.doc_offset = np.concatenate((self.doc_offset, offsets))

    def _compact(self) -> None:
        """Drop what was yielded (the arrays of yielded sequences are views of the old ones, left untouched)."""
        if not self.next:
            return
        done = int(np.searchsorted(self.doc_end, self.next, side="right"))
        cut = self.next
        self.inputs, self.labels, self.starts = self.inputs[cut:], self.labels[cut:], self.starts[cut:]
        self.doc_position, self.doc_offset = self.doc_position[done:], self.doc_offset[done:]
        self.doc_start, self.doc_end = self.doc_start[done:] - cut, self.doc_end[done:] - cut
        self.next = 0

    def take(self, seq_len: int, arange: np.ndarray) -> Sequence:
        """The next ``seq_len`` inputs and labels; positions counted from 0 where each document's run in the
        sequence starts (a document that starts there, or the rest of one cut by the previous sequence:
        torchtitan's per-sequence normalisation). The rest of a document cut by the checkpoint starts at 0 too,
        wherever a reshard puts it (counted from its token offset, a long document's positions would pass
        seq_len, the RoPE cache's end)."""
        lo, hi = self.next, self.next + seq_len
        starts = self.starts[lo:hi].copy()
        starts[0] = True
        positions = arange - np.maximum.accumulate(np.where(starts, arange, 0))
        self.next = hi
        return ({"input": torch.from_numpy(self.inputs[lo:hi]), "positions": torch.from_numpy(positions)},
                torch.from_numpy(self.labels[lo:hi]))

    def cursor(self, read: int) -> tuple[int, int | None]:
        """(plan position, token offset) of the first token not yet yielded; (``read``, None) when every token
        read was yielded (``read``: the plan position of the next document to read)."""
        index = int(np.searchsorted(self.doc_end, self.next, side="right"))
        if index == len(self.doc_end):
            return read, None
        return (int(self.doc_position[index]),
                int(self.doc_offset[index] + max(self.next - int(self.doc_start[index]), 0)))


class PlanPackedDataset(IterableDataset, Stateful, abc.ABC):
    """Documents of a plan packed into ``seq_len`` sequences (see the module docstring)."""

    def __init__(self, name: str, seq_len: int, dp_rank: int, dp_world_size: int, infinite: bool) -> None:
        self.dataset_name, self.seq_len, self.infinite = name, seq_len, infinite
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self._arange = np.arange(seq_len)
        self.resume(fresh_plan(self.rows, dp_world_size, dp_rank, 0), 0)

    @property
    def read_ahead(self) -> int:
        """Input tokens to have read before packing a sequence (at least ``seq_len``)."""
        return self.seq_len

    @property
    @abc.abstractmethod
    def rows(self) -> int:
        """Documents in the dataset (the plan's rows)."""

    @abc.abstractmethod
    def _read(self, piece: Piece, start: int) -> Iterator[Block]:
        """The piece's documents from its position ``start`` to its end, in blocks."""

    def resume(self, plan: list[Piece], epoch: int) -> None:
        """Read ``plan`` from its start with an empty buffer (a fresh start or a restored cursor)."""
        self._plan, self._epoch, self._position = list(plan), epoch, 0
        self._buffer = _Buffer()

    def _fill(self, blocks: Iterator[tuple[np.ndarray, np.ndarray, int]]) -> bool:
        """Read blocks until ``read_ahead`` input tokens are buffered; False when the plan ran out first."""
        while self._buffer.available < self.read_ahead:
            block = next(blocks, None)
            if block is None:
                return self._buffer.available >= self.seq_len
            tokens, lengths, offset = block
            self._buffer.add(tokens, lengths, self._position, offset)
            self._position += len(lengths)
        return True

    def _blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """(tokens, lengths, token offset of the first) of each block from the current plan position on."""
        index, inside = locate(self._plan, self._position)
        for piece in self._plan[index:]:
            offset = piece.offset if inside == 0 else 0
            for tokens, lengths in self._read(piece, piece.begin + inside):
                yield tokens, lengths, offset
                offset = 0
            inside = 0

    def __iter__(self) -> Iterator[Sequence]:
        while True:
            blocks = self._blocks()
            while self._fill(blocks):
                while self._buffer.available >= self.seq_len:
                    yield self._buffer.take(self.seq_len, self._arange)
            if not self.infinite:
                log.warning("Dataset %s has run out of data", self.dataset_name)
                break
            self.resume(fresh_plan(self.rows, self.dp_world_size, self.dp_rank, self._epoch + 1), self._epoch + 1)
            log.warning("Dataset %s is being re-looped (epoch %d)", self.dataset_name, self._epoch)

    def state_dict(self) -> dict[str, Any]:
        """The cursor: plan positions before ``first`` are consumed; the document at ``first`` goes on at token
        ``offset`` (None: at the plan's own offset, nothing of it read)."""
        first, offset = self._buffer.cursor(self._position)
        return {"pieces": [p.as_tuple() for p in self._plan], "first": first, "offset": offset,
                "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resume(remaining(pieces_from_tuples(state_dict["pieces"]), state_dict["first"], state_dict["offset"]),
                    state_dict["epoch"])
