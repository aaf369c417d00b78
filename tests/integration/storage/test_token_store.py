"""Token shards read from a store (slurm_titan.data.token_store) through the checkpoint Store's ranged reads into
a node-local cache: only the blocks holding the documents read are fetched, each verified; a restart on the node
fetches nothing again; a changed or truncated object is refused in one line. On a local folder store, and on
SeaweedFS (marked s3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.ckpt import open_store
from slurm_titan.data import prepare
from slurm_titan.data.token_manifest import parse_manifest
from slurm_titan.data.token_names import ShardError
from slurm_titan.data.token_shards import TokenShards
from slurm_titan.data.token_sources import open_source
from slurm_titan.data.token_store import StoreSource
from slurm_titan.errors import StorageError
from tests.support.token_shards import TOKENIZER, write_shards

BLOCK_KIB = 4
DOCS = [[[d * 1000 + j for j in range(40 + d % 7)] for d in range(s * 60, s * 60 + 60)] for s in range(3)]
"""3 shards of 60 documents of 40-46 int32 tokens: ~10 KiB each, 3 blocks of 4 KiB."""


@pytest.fixture
def uploaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """Shards in a folder, uploaded to a folder store with 4 KiB blocks."""
    monkeypatch.setenv(envvars.CKPT_BLOCK_KB, str(BLOCK_KIB))
    manifest = write_shards(tmp_path / "local", DOCS)
    prepare.upload(tmp_path / "local", manifest, str(tmp_path / "store"))
    return tmp_path / "local", str(tmp_path / "store")


def opened(location: str, cache: Path) -> tuple[TokenShards, StoreSource]:
    source = StoreSource(location, cache)
    return TokenShards(source, parse_manifest(source.manifest(), source.where("manifest.json")), TOKENIZER), source


def fetched(source: StoreSource) -> int:
    return sum(reader.fetched for reader in source.readers)


def test_reads_what_the_folder_holds_fetching_only_the_blocks_read(uploaded, tmp_path: Path) -> None:
    local, location = uploaded
    shards, source = opened(location, tmp_path / "cache")
    assert shards.document(0).tolist() == DOCS[0][0] and fetched(source) == 1
    assert shards.document(130).tolist() == DOCS[2][10] and fetched(source) == 2
    folder = TokenShards.open(str(local), TOKENIZER)
    assert all(shards.document(n).tolist() == folder.document(n).tolist() for n in range(180))
    assert fetched(source) == 9  # 3 blocks a shard, each once


def test_a_restart_on_the_node_fetches_nothing_again(uploaded, tmp_path: Path) -> None:
    _, location = uploaded
    first, source = opened(location, tmp_path / "cache")
    [first.document(n) for n in range(0, 180, 7)]
    again, source = opened(location, tmp_path / "cache")
    assert [again.document(n).tolist() for n in range(0, 180, 7)] == [first.document(n).tolist()
                                                                      for n in range(0, 180, 7)]
    assert fetched(source) == 0


def test_shards_without_block_checksums_are_refused(tmp_path: Path) -> None:
    write_shards(tmp_path / "store", DOCS)  # copied by hand: no upload records
    with pytest.raises(ShardError, match="the manifest records no checksums for it") as refused:
        opened(str(tmp_path / "store"), tmp_path / "cache")
    assert str(refused.value).startswith(f"{tmp_path / 'store' / 'shard-00000.idx'}: ")


def test_a_truncated_object_is_refused_at_start(uploaded, tmp_path: Path) -> None:
    _, location = uploaded
    path = Path(location) / "shard-00001.bin"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ShardError, match="shard-00001.bin: .* bytes in the store, the manifest records .*: truncated"):
        opened(location, tmp_path / "cache")


def test_other_ranks_of_the_node_meet_a_truncated_object_where_they_read_it(uploaded, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, location = uploaded
    monkeypatch.setenv("LOCAL_RANK", "1")  # the node's local rank 0 lists the store; the others do not
    path = Path(location) / "shard-00001.bin"
    path.write_bytes(path.read_bytes()[:-8])
    shards, _ = opened(location, tmp_path / "cache")
    with pytest.raises(StorageError, match="shard-00001.bin") as refused:
        [shards.document(n) for n in range(60, 120)]
    assert "\n" not in str(refused.value)


def test_an_object_changed_since_the_upload_is_refused_where_read(uploaded, tmp_path: Path) -> None:
    _, location = uploaded
    path = Path(location) / "shard-00002.bin"
    data = bytearray(path.read_bytes())
    data[5000] ^= 1  # block 1 of shard 2
    path.write_bytes(bytes(data))
    shards, _ = opened(location, tmp_path / "cache")
    assert shards.document(120).tolist() == DOCS[2][0]
    with pytest.raises(ShardError, match="shard-00002.bin: bytes 4096-8192 do not match the checksum"):
        [shards.document(n) for n in range(120, 180)]


def test_a_changed_index_is_refused_at_start(uploaded, tmp_path: Path) -> None:
    _, location = uploaded
    path = Path(location) / "shard-00000.idx"
    data = bytearray(path.read_bytes())
    data[40] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="shard-00000.idx: its checksum is not the manifest's"):
        opened(location, tmp_path / "cache")


@pytest.mark.s3
def test_s3_reads_through_the_store_into_the_cache(s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envvars.CKPT_BLOCK_KB, str(BLOCK_KIB))
    monkeypatch.setenv(envvars.DATA_CACHE, str(tmp_path / "cache"))
    manifest = write_shards(tmp_path / "local", DOCS)
    location = s3_env.fresh_url("tokens")
    prepare.upload(tmp_path / "local", manifest, location)
    source = open_source(location)
    assert isinstance(source, StoreSource) and source.cache.parent == tmp_path / "cache"
    shards = TokenShards(source, parse_manifest(source.manifest(), location), TOKENIZER)
    assert [shards.document(n).tolist() for n in (0, 61, 179)] == [DOCS[0][0], DOCS[1][1], DOCS[2][59]]
    assert fetched(source) == 3
    open_store(location).rm_files(["shard-00001.bin"])
    with pytest.raises(ShardError, match=r"shard-00001.bin: missing from the store"):
        TokenShards.open(location, TOKENIZER)
