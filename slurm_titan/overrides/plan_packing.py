"""torchtitan's packing of documents into ``seq_len`` sequences, read over a :class:`~slurm_titan.data.cursor.Piece`
plan with an exact cursor: the base of the resharding loader's text dataset and of the token-shard dataset.

Per document, as torchtitan's ``HuggingFaceTextDataset``: inputs and labels shifted by one inside it (a
document boundary is never crossed by a label), positions counted from 0 where its run in a sequence starts
(the per-document mask of the NPU attention and the reference attention). In addition the dataset knows how
many tokens of each buffered document are still in the buffer, which makes the cursor exact: its state is
(plan, oldest document with tokens in the buffer, their token offset, epoch), see :mod:`slurm_titan.data.cursor`.
A subclass says how many documents there are (:attr:`rows`) and reads a piece's documents (:meth:`_read`).
"""

from __future__ import annotations

import abc
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from slurm_titan.data.cursor import Piece, fresh_plan, locate, pieces_from_tuples, remaining

log = logging.getLogger("slurm_titan.overrides.plan_packing")

Sequence = tuple[dict[str, torch.Tensor], torch.Tensor]
"""One packed sequence: ``({"input", "positions"}, labels)``."""


class PlanPackedDataset(IterableDataset, Stateful, abc.ABC):
    """Documents of a plan packed into ``seq_len`` sequences (see the module docstring)."""

    def __init__(self, name: str, seq_len: int, dp_rank: int, dp_world_size: int, infinite: bool) -> None:
        self.dataset_name, self.seq_len, self.infinite = name, seq_len, infinite
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self._arange = torch.arange(seq_len)  # the positions of each document's run in a sequence: a slice of it
        self.resume(fresh_plan(self.rows, dp_world_size, dp_rank, 0), 0)

    @property
    @abc.abstractmethod
    def rows(self) -> int:
        """Documents in the dataset (the plan's rows)."""

    @abc.abstractmethod
    def _read(self, piece: Piece, start: int) -> Iterator[torch.Tensor]:
        """The token ids (BOS .. EOS, int64) of the piece's documents from its position ``start`` to its end."""

    def resume(self, plan: list[Piece], epoch: int) -> None:
        """Read ``plan`` from its start with empty buffers (a fresh start or a restored cursor)."""
        self._plan, self._epoch, self._position = list(plan), epoch, 0
        self._buffer: deque[tuple[torch.Tensor, int]] = deque()  # buffered documents' (tokens, first not yielded)
        self._buffered = 0  # input tokens in the buffer

    def _documents(self) -> Iterator[tuple[torch.Tensor, int]]:
        """(tokens, token offset) of each document from the current plan position on."""
        index, inside = locate(self._plan, self._position)
        for piece in self._plan[index:]:
            offset = piece.offset if inside == 0 else 0
            for tokens in self._read(piece, piece.begin + inside):
                yield tokens, offset
                offset = 0
            inside = 0

    def _sequence(self) -> Sequence:
        """The next ``seq_len`` tokens of the buffer, as torchtitan packs them: inputs and labels shifted inside
        each document, and each document's positions counted from 0 where its run in the sequence starts (a
        document that starts there, or the rest of one cut by the previous sequence: torchtitan's per-sequence
        normalisation). The rest of a document cut by the checkpoint starts at 0 too, wherever a reshard puts it
        (counted from its token offset, a long document's positions would pass seq_len, the RoPE cache's end)."""
        inputs, labels, positions, need = [], [], [], self.seq_len
        while need:
            tokens, start = self._buffer[0]
            count = min(len(tokens) - 1 - start, need)
            inputs.append(tokens[start:start + count])
            labels.append(tokens[start + 1:start + 1 + count])
            positions.append(self._arange[:count])
            need -= count
            if start + count == len(tokens) - 1:
                self._buffer.popleft()
            else:
                self._buffer[0] = (tokens, start + count)
        self._buffered -= self.seq_len
        return {"input": torch.cat(inputs), "positions": torch.cat(positions)}, torch.cat(labels)

    def __iter__(self) -> Iterator[Sequence]:
        # Each document's tokens become one tensor once, and a sequence is cut from slices of them: building the
        # three tensors of every sequence from Python lists (torchtitan's way) is the loader's largest cost
        # after the tokenizer (3 x 22 us per 256 tokens), and slicing lists copies a long document's rest per
        # sequence.
        while True:
            for tokens, offset in self._documents():
                self._position += 1
                if len(tokens) - 1 <= offset:
                    continue
                self._buffer.append((tokens, offset))
                self._buffered += len(tokens) - 1 - offset
                while self._buffered >= self.seq_len:
                    yield self._sequence()
            if not self.infinite:
                log.warning("Dataset %s has run out of data", self.dataset_name)
                break
            self.resume(fresh_plan(self.rows, self.dp_world_size, self.dp_rank, self._epoch + 1), self._epoch + 1)
            log.warning("Dataset %s is being re-looped (epoch %d)", self.dataset_name, self._epoch)

    def state_dict(self) -> dict[str, Any]:
        """The cursor: plan positions before ``first`` are consumed; the document at ``first`` goes on at token
        ``offset`` (None: at the plan's own offset, nothing of it read)."""
        return {"pieces": [p.as_tuple() for p in self._plan], "first": self._position - len(self._buffer),
                "offset": self._buffer[0][1] if self._buffer else None, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resume(remaining(pieces_from_tuples(state_dict["pieces"]), state_dict["first"], state_dict["offset"]),
                    state_dict["epoch"])
