"""A token-shard dataset as numbered documents (slurm_titan.data.token_shards, torch-free): read through its
shards in manifest order, and every bad input refused in one line naming the file, at start where it can be
known."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_titan.data import identity
from slurm_titan.data.cursor import Piece
from slurm_titan.data.token_manifest import MANIFEST_FILE, TokenizerInfo, parse_manifest, tokenizer_digest
from slurm_titan.data.token_names import ShardError
from slurm_titan.data.token_shards import TokenShards, plan_documents
from tests.support.token_shards import TOKENIZER, write_shards

SHARDS = [[[1, 2, 3], [4, 5]], [[6], [7, 8, 9, 10]], [[11, 12]]]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_shards(tmp_path / "ds", SHARDS)
    return tmp_path / "ds"


def refused(location: Path | str, tokenizer: TokenizerInfo = TOKENIZER) -> str:
    with pytest.raises(ShardError) as error:
        TokenShards.open(str(location), tokenizer)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_documents_are_numbered_through_the_shards_in_order(folder: Path) -> None:
    shards = TokenShards.open(str(folder), TOKENIZER)
    assert shards.documents == 5
    assert [shards.document(n).tolist() for n in range(5)] == [d for shard in SHARDS for d in shard]
    with pytest.raises(IndexError):
        shards.document(5)


def test_another_tokenizer_is_refused(folder: Path) -> None:
    other = replace(TOKENIZER, digest=tokenizer_digest({"a": 0}, 0, 1), bos_id=0, eos_id=1)
    message = refused(folder, other)
    assert message.startswith(f"{folder / MANIFEST_FILE}: the shards were made with another tokenizer")
    assert "prepare them again with the job's tokenizer" in message


def test_a_token_id_outside_the_vocabulary_is_refused_at_start(folder: Path) -> None:
    assert "shard shard-00001 holds token id 10, outside the job's vocabulary of 8" in refused(
        folder, replace(TOKENIZER, vocab_size=8))


def test_a_token_id_outside_the_vocabulary_that_the_manifest_hides_is_refused_on_read(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    for shard in manifest["shards"]:
        shard["max_token"] = 3
    manifest["tokenizer"]["vocab_size"] = 8
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    shards = TokenShards.open(str(folder), replace(TOKENIZER, vocab_size=8))
    assert shards.document(0).tolist() == [1, 2, 3]
    with pytest.raises(ShardError, match=f"^{folder / 'shard-00001.bin'}: document 1 holds token id 10, outside"):
        shards.document(3)


@pytest.mark.parametrize(("damage", "says"), [
    (lambda f: (f / "shard-00001.bin").write_bytes((f / "shard-00001.bin").read_bytes()[:-4]), "shard-00001.bin: 16 "
     "bytes, but its index"),
    (lambda f: (f / "shard-00002.idx").unlink(), "shard-00002.idx: cannot read the index"),
    (lambda f: (f / "shard-00000.bin").unlink(), "shard-00000.bin: cannot read the token data"),
    (lambda f: (f / "shard-00000.idx").write_bytes((f / "shard-00000.idx").read_bytes()[:40]), "shard-00000.idx: 40 "
     "bytes, but its header promises"),
    (lambda f: shutil.copy(f / "shard-00000.idx", f / "shard-00002.idx"), "shard-00002.idx: 2 documents of 5 tokens, "
     "the manifest says 1 of 2"),
    (lambda f: (f / MANIFEST_FILE).unlink(), "manifest.json: no token-shard manifest there"),
    (lambda f: (f / MANIFEST_FILE).write_text("{"), "manifest.json: not JSON"),
    (lambda f: (f / MANIFEST_FILE).write_text('{"format": "other/1"}'), "not a token-shard manifest"),
])
def test_bad_input_is_refused_at_start_in_one_line_naming_the_file(folder: Path, damage, says: str) -> None:
    damage(folder)
    message = refused(folder)
    assert message.startswith(str(folder)) and says in message, message


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    assert refused(tmp_path / "nowhere") == (f"{tmp_path / 'nowhere' / MANIFEST_FILE}: no such folder (make one with "
                                             "`slurm-titan data prepare`)")


def test_manifest_shard_names_stay_inside_the_dataset() -> None:
    raw = {"format": "slurm-titan-token-shards/1", "dtype": "int32", "tokenizer": {"digest": "d", "vocab_size": 9},
           "shards": [{"name": "../x", "documents": 1, "tokens": 1, "max_token": 1, "bin_size": 4, "idx_size": 1}]}
    with pytest.raises(ShardError, match="refusing shard name '../x'"):
        parse_manifest(json.dumps(raw), "m.json")


def test_the_fingerprint_follows_the_content_not_the_path(folder: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    here, there = (TokenShards.open(str(f), TOKENIZER) for f in (folder, moved))
    assert identity.difference(here.manifest.fingerprint(here.location), there.manifest.fingerprint(there.location)) \
        is None
    other = write_shards(tmp_path / "other", [[[1, 2, 3], [4, 6]], *SHARDS[1:]])
    changed = identity.difference(here.manifest.fingerprint(here.location), other.fingerprint(str(tmp_path / "other")))
    assert changed and "head_sha256" in changed


def test_epoch_0_reads_in_order_and_later_epochs_a_seeded_permutation_of_the_share() -> None:
    first = Piece(100, 3, 1, 0, 5, 20)  # shard 1 of 3 over 100 documents: 34..66
    assert plan_documents(first, 42).tolist() == list(range(39, 54))
    later = Piece(100, 3, 1, 2, 0, 33)
    order = plan_documents(later, 42)
    assert sorted(order.tolist()) == list(range(34, 67)) and order.tolist() != list(range(34, 67))
    assert np.array_equal(order, plan_documents(later, 42))
    assert not np.array_equal(order, plan_documents(later, 7))
    assert np.array_equal(plan_documents(replace(later, begin=10, end=20), 42), order[10:20])


def test_megatron_shards_made_elsewhere_get_a_manifest(tmp_path: Path) -> None:
    """`slurm-titan data index`: Megatron's own layout (several sequences a document, int32) read as documents."""
    from slurm_titan.data.prepare import index_folder
    from tests.unit.data.test_megatron_index import megatron_idx

    folder = tmp_path / "megatron"
    folder.mkdir()
    for name, lengths, documents, first in (("a_text_document", [2, 3, 1], [0, 2, 3], 0), ("b_text_document", [4],
                                                                                            [0, 1], 6)):
        (folder / f"{name}.idx").write_bytes(megatron_idx(4, 4, lengths, documents))
        (folder / f"{name}.bin").write_bytes(np.arange(first, first + sum(lengths), dtype=np.int32).tobytes())
    manifest = index_folder(folder, TOKENIZER)
    assert [(s.name, s.documents, s.tokens, s.max_token) for s in manifest.shards] == [
        ("a_text_document", 2, 6, 5), ("b_text_document", 1, 4, 9)]
    shards = TokenShards.open(str(folder), TOKENIZER)
    assert [shards.document(n).tolist() for n in range(3)] == [[0, 1, 2, 3, 4], [5], [6, 7, 8, 9]]
    (folder / "b_text_document.bin").unlink()
    with pytest.raises(ShardError, match=f"^{folder / 'b_text_document.bin'}: cannot read the token data"):
        index_folder(folder, TOKENIZER)
    with pytest.raises(ShardError, match="no Megatron shards"):
        index_folder(tmp_path, TOKENIZER)
