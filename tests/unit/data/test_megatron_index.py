"""Megatron's .bin/.idx, read and written without Megatron (slurm_titan.data.megatron_index): the bytes of the
format as Megatron-LM's _IndexWriter lays them out, and every inconsistency refused in one line naming the file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from slurm_titan.data.megatron_index import (
    ShardWriter,
    bin_path,
    code_of,
    idx_path,
    index_bytes,
    open_bin,
    read_index,
    token_dtype,
)
from slurm_titan.data.token_names import ShardError

DOCS = [[0, 5, 6, 1], [0, 7, 1], [0, 1], [0, 9, 9, 9, 9, 1]]


def megatron_idx(code: int, itemsize: int, lengths: list[int], documents: list[int]) -> bytes:
    """The .idx as megatron/core/datasets/indexed_dataset.py's _IndexWriter writes it, spelled out field by field."""
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * itemsize
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
            + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(documents))
            + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(documents)}q", *documents))


def write(folder: Path, docs=DOCS, dtype=np.uint16) -> Path:
    prefix = folder / "shard"
    with ShardWriter(prefix, dtype) as shard:
        for doc in docs:
            shard.add_document(doc)
    return prefix


@pytest.mark.parametrize(("dtype", "code"), [(np.uint16, 8), (np.int32, 4), (np.int64, 5), (np.uint8, 1)])
def test_the_writer_writes_megatrons_bytes(tmp_path: Path, dtype, code: int) -> None:
    docs = [[d % 200 for d in doc] for doc in DOCS]
    prefix = write(tmp_path, docs, dtype)
    lengths = [len(doc) for doc in docs]
    assert idx_path(prefix).read_bytes() == megatron_idx(code, np.dtype(dtype).itemsize, lengths, [0, 1, 2, 3, 4])
    assert bin_path(prefix).read_bytes() == np.concatenate([np.asarray(d, dtype=dtype) for d in docs]).tobytes()
    assert code_of(dtype) == code
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.bin", "shard.idx"]  # no temporary left


def test_the_reader_reads_a_megatron_index_of_several_sequences_per_document(tmp_path: Path) -> None:
    """Megatron's own layout (an index written by its builder with add_item x 3 + end_document, ...): a document
    is its sequences, contiguous in the .bin."""
    lengths, documents = [2, 3, 1, 4], [0, 3, 4]
    (tmp_path / "m.idx").write_bytes(megatron_idx(4, 4, lengths, documents))
    (tmp_path / "m.bin").write_bytes(np.arange(10, dtype=np.int32).tobytes())
    index = read_index(tmp_path / "m.idx")
    assert (index.documents, index.tokens, index.bin_size) == (2, 10, 40)
    assert index.document_tokens().tolist() == [6, 4] and index.document_offsets().tolist() == [0, 24, 40]
    assert open_bin(tmp_path / "m.bin", index)[6:10].tolist() == [6, 7, 8, 9]
    assert index_bytes(np.int32, np.array(lengths), np.array(documents)) == (tmp_path / "m.idx").read_bytes()


def test_an_empty_shard_round_trips(tmp_path: Path) -> None:
    prefix = write(tmp_path, [])
    index = read_index(idx_path(prefix))
    assert (index.documents, index.tokens, len(open_bin(bin_path(prefix), index))) == (0, 0, 0)


def test_a_failed_shard_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "shard", np.uint16) as shard:
        shard.add_document([1, 2])
        raise RuntimeError("tokenizer died")
    assert list(tmp_path.iterdir()) == []


def test_token_dtype_is_megatrons_optimal_dtype() -> None:
    assert token_dtype(2000) is np.uint16 and token_dtype(65500) is np.int32 and token_dtype(128256) is np.int32


def corrupt(tmp_path: Path, edit) -> str:
    prefix = write(tmp_path)
    data = bytearray(idx_path(prefix).read_bytes())
    idx_path(prefix).write_bytes(bytes(edit(data)))
    with pytest.raises(ShardError) as refused:
        read_index(idx_path(prefix))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(idx_path(prefix)))
    return message


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d[:20], "shorter than the 34-byte index header"),
    (lambda d: d[:-5], "truncated"),
    (lambda d: b"XXIDIDX\x00\x00" + d[9:], "not an .idx"),
    (lambda d: d[:9] + struct.pack("<Q", 2) + d[17:], "index version 2"),
    (lambda d: d[:17] + bytes([9]) + d[18:], "unknown dtype code 9"),
    (lambda d: d[:17] + bytes([7]) + d[18:], "float32 cannot hold token ids"),
    (lambda d: d[:34] + struct.pack("<i", 5) + d[38:], "not back to back"),
    (lambda d: d[:-8] + struct.pack("<q", 3), "document indices"),
])
def test_a_broken_index_is_refused_in_one_line(tmp_path: Path, edit, says: str) -> None:
    assert says in corrupt(tmp_path, edit)


@pytest.mark.parametrize(("cut", "says"), [(-2, "truncated"), (4, "longer than its index says")])
def test_a_bin_whose_size_disagrees_with_its_index_is_refused(tmp_path: Path, cut: int, says: str) -> None:
    prefix = write(tmp_path)
    data = bin_path(prefix).read_bytes()
    bin_path(prefix).write_bytes(data[:cut] if cut < 0 else data + bytes(cut))
    with pytest.raises(ShardError, match=says) as refused:
        open_bin(bin_path(prefix), read_index(idx_path(prefix)))
    assert str(refused.value).startswith(f"{bin_path(prefix)}: ")


def test_a_missing_file_of_the_pair_is_named(tmp_path: Path) -> None:
    prefix = write(tmp_path)
    index = read_index(idx_path(prefix))
    bin_path(prefix).unlink()
    with pytest.raises(ShardError, match=f"^{bin_path(prefix)}: cannot read the token data"):
        open_bin(bin_path(prefix), index)
    idx_path(prefix).unlink()
    with pytest.raises(ShardError, match=f"^{idx_path(prefix)}: cannot read the index"):
        read_index(idx_path(prefix))
