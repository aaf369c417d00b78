"""Megatron-LM's indexed dataset (``.bin`` + ``.idx``), read and written without Megatron or torch.

The format (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``, ``_IndexWriter``/``_IndexReader``):
the ``.bin`` is the token ids of every sequence, back to back, in one numpy dtype; the ``.idx`` is, all
little-endian::

    b"MMIDIDX\\x00\\x00"        9 bytes
    version                     uint64, 1
    dtype code                  uint8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    sequence count S            uint64
    document count D + 1        uint64
    sequence lengths            S x int32 (tokens)
    sequence pointers           S x int64 (byte offset of each sequence in the .bin)
    document indices            (D + 1) x int64: 0, then the sequence index after each document's last

(a multimodal index adds S x int8 modes; not read here). A document is its sequences, contiguous in the
``.bin``. :class:`ShardWriter` writes what Megatron's ``IndexedDatasetBuilder`` writes for one sequence per
document (``add_document(tokens, [len(tokens)])``); :func:`read_index` checks everything the header and
arrays promise against the file's size, and :meth:`MegatronIndex.check_bin` the ``.bin``'s size against the
index, each failure one :class:`ShardError` line naming the file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
from numpy.typing import DTypeLike

from slurm_titan.data.token_names import ShardError

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES: dict[int, type[np.number]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                                           6: np.float64, 7: np.float32, 8: np.uint16}
_PREAMBLE = struct.Struct("<9sQBQQ")  # header, version, dtype code, sequence count, document count + 1
INTEGER_CODES = (1, 2, 3, 4, 5, 8)
"""The dtype codes that can hold token ids."""


def code_of(dtype: DTypeLike) -> int:
    """Megatron's code of a numpy dtype."""
    name = np.dtype(dtype)
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == name:
            return code
    raise ValueError(f"numpy dtype {name} has no Megatron code")


def token_dtype(vocab_size: int) -> type[np.number]:
    """The smallest dtype for ids below ``vocab_size`` (Megatron's ``optimal_dtype``: uint16 under 65,500)."""
    return np.uint16 if vocab_size < 65500 else np.int32


def idx_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def bin_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


@dataclass(frozen=True, kw_only=True)
class MegatronIndex:
    """A parsed ``.idx``: ``lengths``/``pointers`` per sequence, ``documents`` (D + 1 sequence indices)."""

    path: str
    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    document_indices: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    @property
    def bin_size(self) -> int:
        """The byte size the ``.bin`` must have: the end of its last sequence."""
        if not len(self.lengths):
            return 0
        return int(self.pointers[-1]) + int(self.lengths[-1]) * self.dtype.itemsize

    def document_tokens(self) -> np.ndarray:
        """Tokens of each document (int64)."""
        ends = np.concatenate(([0], np.cumsum(self.lengths, dtype=np.int64)))
        return ends[self.document_indices[1:]] - ends[self.document_indices[:-1]]

    def document_offsets(self) -> np.ndarray:
        """Byte offset of each document in the ``.bin`` (its first sequence's pointer; D + 1 entries, the last
        the end of the data)."""
        starts = np.append(self.pointers, np.int64(self.bin_size))
        return starts[self.document_indices]

    def check_bin(self, size: int, where: str) -> None:
        """A ``.bin`` of ``size`` bytes (named ``where``) is the one this index describes."""
        if size != self.bin_size:
            state = "truncated" if size < self.bin_size else "longer than its index says"
            raise ShardError(f"{where}: {size} bytes, but its index {self.path} says {self.bin_size} "
                             f"({self.tokens} tokens of {self.dtype.name}): {state}")


def parse_index(buffer: np.ndarray, where: str) -> MegatronIndex:
    """The index in ``buffer`` (the bytes of the whole ``.idx`` file named ``where``, uint8), checked."""
    if len(buffer) < _PREAMBLE.size:
        raise ShardError(f"{where}: {len(buffer)} bytes, shorter than the {_PREAMBLE.size}-byte index header: "
                         "truncated or not a Megatron .idx")
    header, version, code, sequences, document_entries = _PREAMBLE.unpack(bytes(buffer[:_PREAMBLE.size]))
    if header != HEADER:
        raise ShardError(f"{where}: starts with {bytes(header)!r}, not Megatron's {HEADER!r}: not an .idx")
    if version != VERSION:
        raise ShardError(f"{where}: index version {version}, only version {VERSION} is known")
    if code not in DTYPE_CODES:
        raise ShardError(f"{where}: unknown dtype code {code}")
    if code not in INTEGER_CODES:
        raise ShardError(f"{where}: dtype {np.dtype(DTYPE_CODES[code]).name} cannot hold token ids")
    need = _PREAMBLE.size + sequences * 12 + document_entries * 8
    if len(buffer) < need:
        raise ShardError(f"{where}: {len(buffer)} bytes, but its header promises {sequences} sequences and "
                         f"{document_entries} document indices ({need} bytes): truncated")
    offset = _PREAMBLE.size
    lengths = np.frombuffer(buffer, dtype="<i4", count=sequences, offset=offset)
    pointers = np.frombuffer(buffer, dtype="<i8", count=sequences, offset=offset + lengths.nbytes)
    documents = np.frombuffer(buffer, dtype="<i8", count=document_entries,
                              offset=offset + lengths.nbytes + pointers.nbytes)
    dtype = np.dtype(DTYPE_CODES[code])
    index = MegatronIndex(path=where, dtype=dtype, lengths=lengths, pointers=pointers, document_indices=documents)
    _check_arrays(index, where)
    return index


def _check_arrays(index: MegatronIndex, where: str) -> None:
    lengths, pointers, documents = index.lengths, index.pointers, index.document_indices
    if len(lengths) and int(lengths.min()) < 0:
        raise ShardError(f"{where}: negative sequence length at sequence {int(np.argmin(lengths))}")
    expected = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))) * index.dtype.itemsize
    if len(pointers) and not np.array_equal(pointers, expected):
        bad = int(np.argmax(pointers != expected))
        raise ShardError(f"{where}: sequence {bad} starts at byte {int(pointers[bad])}, but the lengths before it "
                         f"end at byte {int(expected[bad])}: the sequences are not back to back")
    if not len(documents) or documents[0] != 0 or documents[-1] != len(lengths) or np.any(np.diff(documents) < 0):
        raise ShardError(f"{where}: document indices do not run from 0 to the sequence count {len(lengths)} "
                         "without going back")


def read_index(path: str | Path, where: str | None = None) -> MegatronIndex:
    """The ``.idx`` at ``path`` (memory-mapped), checked; a missing one is a :class:`ShardError`. Messages name
    it ``where`` (default: its path)."""
    where = where or str(path)
    try:
        size = os.path.getsize(path)
    except OSError as error:
        raise ShardError(f"{where}: cannot read the index: {error.strerror}") from None
    data = np.memmap(path, mode="r", dtype=np.uint8) if size else np.zeros(0, dtype=np.uint8)
    return parse_index(data, where)


def open_bin(path: str | Path, index: MegatronIndex) -> np.ndarray:
    """The ``.bin`` at ``path`` as a read-only memory map of ``index``'s dtype, its size checked."""
    try:
        size = os.path.getsize(path)
    except OSError as error:
        raise ShardError(f"{path}: cannot read the token data: {error.strerror} (its index is {index.path})") from None
    index.check_bin(size, str(path))
    if not size:
        return np.zeros(0, dtype=index.dtype)
    return np.memmap(path, mode="r", dtype=index.dtype)


def index_bytes(dtype: DTypeLike, lengths: np.ndarray, document_indices: np.ndarray) -> bytes:
    """The ``.idx`` of sequences of ``lengths`` grouped by ``document_indices`` (Megatron's ``_IndexWriter``)."""
    lengths = np.asarray(lengths, dtype="<i4")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))).astype("<i8") * itemsize
    pointers = pointers[:len(lengths)]
    documents = np.asarray(document_indices, dtype="<i8")
    return (_PREAMBLE.pack(HEADER, VERSION, code_of(dtype), len(lengths), len(documents))
            + lengths.tobytes() + pointers.tobytes() + documents.tobytes())


class ShardWriter:
    """Writes one shard, one sequence per document; it appears only when complete: the ``.bin`` and ``.idx``
    are written under temporary names and renamed, the ``.idx`` last (a shard whose ``.idx`` exists is whole).

        with ShardWriter(prefix, np.uint16) as shard:
            shard.add_document(tokens)
    """

    def __init__(self, prefix: str | Path, dtype: DTypeLike) -> None:
        self.prefix, self.dtype = Path(prefix), np.dtype(dtype)
        self._bin_tmp = self.prefix.with_name(f".{self.prefix.name}.bin.tmp")
        self._out = self._bin_tmp.open("wb")
        self.lengths: list[int] = []

    def add_document(self, tokens: np.ndarray | list[int]) -> None:
        array = np.asarray(tokens, dtype=self.dtype)
        self._out.write(array.tobytes())
        self.lengths.append(len(array))

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._out.close()
        if kind is not None:
            self._bin_tmp.unlink(missing_ok=True)
            return
        idx_tmp = self.prefix.with_name(f".{self.prefix.name}.idx.tmp")
        lengths = np.asarray(self.lengths, dtype=np.int64)
        idx_tmp.write_bytes(index_bytes(self.dtype, lengths, np.arange(len(lengths) + 1)))
        os.replace(self._bin_tmp, bin_path(self.prefix))
        os.replace(idx_tmp, idx_path(self.prefix))
