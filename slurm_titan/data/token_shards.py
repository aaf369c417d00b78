"""A token-shard dataset as numbered documents (torch-free): what the token-shard loader reads.

:meth:`TokenShards.open` reads the manifest, refuses another tokenizer, opens every shard's index and checks
it and its ``.bin`` against the manifest and each other, all before the first step, each failure one line
naming the file. Documents are numbered through the shards in manifest order; :meth:`TokenShards.document`
gives one's token ids and refuses an id outside the vocabulary (the manifest's largest id was checked at the
start; this catches shards whose manifest says otherwise). :func:`plan_documents` is the document order of
a plan piece (:mod:`.cursor`): the shard's own order in epoch 0, a permutation seeded by ``seed + epoch``
after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from slurm_titan.data.cursor import Piece, base_rows
from slurm_titan.data.megatron_index import MegatronIndex
from slurm_titan.data.token_manifest import MANIFEST_FILE, Manifest, ShardInfo, TokenizerInfo, parse_manifest
from slurm_titan.data.token_names import ShardError
from slurm_titan.data.token_sources import ShardSource, TokenReader, open_source


@dataclass(frozen=True)
class _Opened:
    info: ShardInfo
    index: MegatronIndex
    reader: TokenReader
    offsets: np.ndarray  # byte offset of each document, then the end
    lengths: np.ndarray  # tokens of each document
    where: str


class TokenShards:
    """Every document of a token-shard dataset, readable by number."""

    def __init__(self, source: ShardSource, manifest: Manifest, tokenizer: TokenizerInfo) -> None:
        self.source, self.manifest, self.vocab_size = source, manifest, tokenizer.vocab_size
        manifest.check_tokenizer(tokenizer, source.where(MANIFEST_FILE))
        self._shards = [self._open(info) for info in manifest.shards]
        self._starts = np.cumsum([0] + [shard.info.documents for shard in self._shards], dtype=np.int64)

    @classmethod
    def open(cls, location: str, tokenizer: TokenizerInfo) -> TokenShards:
        source = open_source(location)
        return cls(source, parse_manifest(source.manifest(), source.where(MANIFEST_FILE)), tokenizer)

    @property
    def documents(self) -> int:
        return int(self._starts[-1])

    @property
    def location(self) -> str:
        return self.source.location

    def _open(self, info: ShardInfo) -> _Opened:
        index = self.source.index(info)
        where = self.source.where(info.idx)
        if index.dtype.name != self.manifest.dtype:
            raise ShardError(f"{where}: tokens of {index.dtype.name}, the manifest says {self.manifest.dtype}")
        lengths = index.document_tokens()
        if index.documents != info.documents or int(lengths.sum()) != info.tokens:
            raise ShardError(f"{where}: {index.documents} documents of {int(lengths.sum())} tokens, the manifest says "
                             f"{info.documents} of {info.tokens}: the shard changed since the manifest was made")
        reader = self.source.tokens(info, index)
        return _Opened(info, index, reader, index.document_offsets(), lengths, self.source.where(info.bin))

    def _shard_of(self, numbers: np.ndarray) -> np.ndarray:
        if len(numbers) and not (int(numbers.min()) >= 0 and int(numbers.max()) < self.documents):
            raise IndexError(f"documents {int(numbers.min())}..{int(numbers.max())} of {self.documents}")
        return np.searchsorted(self._starts, numbers, side="right") - 1

    def lengths(self, numbers: np.ndarray) -> np.ndarray:
        """Tokens of each of documents ``numbers`` (counted through all shards)."""
        shard_of = self._shard_of(numbers)
        out = np.empty(len(numbers), dtype=np.int64)
        for shard in np.unique(shard_of).tolist():
            mine = shard_of == shard
            out[mine] = self._shards[shard].lengths[numbers[mine] - self._starts[shard]]
        return out

    def read(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token ids of documents ``numbers`` back to back, and each one's length; a run of consecutive
        documents of one shard is read as one range."""
        shard_of = self._shard_of(numbers)
        breaks = np.flatnonzero((np.diff(numbers) != 1) | (np.diff(shard_of) != 0)) + 1
        parts, lengths = [], []
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), len(numbers)]):
            shard = self._shards[int(shard_of[lo])]
            first = int(numbers[lo] - self._starts[shard_of[lo]])
            last = first + hi - lo
            count = int(shard.offsets[last] - shard.offsets[first]) // shard.index.dtype.itemsize
            tokens = shard.reader.read(int(shard.offsets[first]), count)
            if len(tokens) != count:
                raise ShardError(f"{shard.where}: documents {first}..{last - 1} end past the end of the file: "
                                 "truncated")
            if count and int(tokens.max()) >= self.vocab_size:
                bad = first + int(np.searchsorted(np.cumsum(shard.lengths[first:last]), np.argmax(tokens), "right"))
                raise ShardError(f"{shard.where}: document {bad} holds token id {int(tokens.max())}, outside the "
                                 f"vocabulary of {self.vocab_size}")
            parts.append(tokens)
            lengths.append(shard.lengths[first:last])
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(parts), np.concatenate(lengths)

    def document(self, number: int) -> np.ndarray:
        """The token ids of document ``number`` (counted through all shards)."""
        return self.read(np.array([number]))[0]


@lru_cache(maxsize=2)
def _permutation(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(length)


def plan_documents(piece: Piece, seed: int) -> np.ndarray:
    """Global document numbers of the piece's positions, in reading order."""
    rows = base_rows(piece)
    if not piece.epoch:
        return np.arange(rows.start + piece.begin, rows.start + piece.end, dtype=np.int64)
    return rows.start + _permutation(len(rows), seed + piece.epoch)[piece.begin:piece.end].astype(np.int64)
