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

    def document(self, number: int) -> np.ndarray:
        """The token ids of document ``number`` (counted through all shards)."""
        shard_number = int(np.searchsorted(self._starts, number, side="right")) - 1
        if not 0 <= number < self.documents:
            raise IndexError(f"document {number} of {self.documents}")
        shard = self._shards[shard_number]
        local = number - int(self._starts[shard_number])
        tokens = shard.reader.read(int(shard.offsets[local]), int(shard.lengths[local]))
        if len(tokens) != shard.lengths[local]:
            raise ShardError(f"{shard.where}: document {local} ends past the end of the file: truncated")
        if len(tokens) and int(tokens.max()) >= self.vocab_size:
            raise ShardError(f"{shard.where}: document {local} holds token id {int(tokens.max())}, outside the "
                             f"vocabulary of {self.vocab_size}")
        return tokens


def plan_documents(piece: Piece, seed: int) -> np.ndarray:
    """Global document numbers of the piece's positions, in reading order."""
    rows = base_rows(piece)
    if not piece.epoch:
        return np.arange(rows.start + piece.begin, rows.start + piece.end, dtype=np.int64)
    order = np.random.default_rng(seed + piece.epoch).permutation(len(rows))
    return rows.start + order[piece.begin:piece.end].astype(np.int64)
