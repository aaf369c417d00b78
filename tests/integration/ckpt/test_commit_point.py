"""The commit point on a store that ignores If-None-Match (rclone's `serve s3` answers a conditional PUT and a
conditional multipart complete on an existing key with 200 and replaces the object): the committer whose record
is there after its write has committed, the other keeps it; the index stays below the single-PUT limit; and on
SeaweedFS and moto an index-sized record is created once, a conditional multipart complete refused."""

from __future__ import annotations

import threading

import pytest

from slurm_titan.ckpt import commit, layout, manifest
from slurm_titan.ckpt.storage import open_store
from slurm_titan.errors import StorageError
from tools.bench import scale_record as bench
from tools.local_s3.moto_server import Server as MotoServer
from tools.local_s3.moto_server import find_moto_server, free_port

N = 2


def _commit(store, committed_by="first"):
    return commit.commit(store, bench.STEP, world_size=N, attempt="bench", algorithm="xxh3_128", config_digest="",
                         saved_at="", committed_by=committed_by, retry=lambda what, fn: fn(), stop=threading.Event(),
                         poll_interval=0.05)


def _ignoring_if_none_match(store, after_write=None):
    """``store`` whose create_bytes always writes and says it created (``after_write``: another writer next)."""
    def create(rel, data):
        store.put_bytes(rel, data)
        if after_write:
            after_write(rel)
        return True

    store.create_bytes = create
    return store


def test_a_second_committer_keeps_the_record_there(tmp_path):
    location = str(tmp_path / "remote")
    bench.prepare(location, N, 1, "replicated")
    first = _commit(open_store(location))
    record = open_store(location).cat(layout.commit_path(bench.STEP))
    assert first is not None
    assert _commit(_ignoring_if_none_match(open_store(location)), committed_by="second") is None
    assert open_store(location).cat(layout.commit_path(bench.STEP)) == record  # never replaced


def test_a_committer_whose_record_was_replaced_has_not_committed(tmp_path):
    location = str(tmp_path / "remote")
    bench.prepare(location, N, 1, "replicated")
    store = _ignoring_if_none_match(open_store(location), lambda rel: open_store(location).put_bytes(rel, b"{}"))
    assert _commit(store) is None
    assert not store.exists(layout.CATALOG_DIR)  # no catalog entry: the record there is not this committer's


def test_a_retried_write_that_finds_its_own_record_has_committed(tmp_path):
    location = str(tmp_path / "remote")
    bench.prepare(location, N, 1, "replicated")
    store = open_store(location)
    calls = []

    def retry(what, fn):
        if what == "writing the commit record":  # the first try landed, its answer was lost
            calls.append(fn())
        return fn()

    m = commit.commit(store, bench.STEP, world_size=N, attempt="bench", algorithm="xxh3_128", config_digest="",
                      saved_at="", committed_by="x", retry=retry, stop=threading.Event(), poll_interval=0.05)
    assert calls == [True] and m is not None


def test_an_index_above_the_single_put_limit_is_never_written(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    bench.prepare(location, N, 1, "replicated")
    monkeypatch.setattr(manifest, "INDEX_MAX_BYTES", 1000)
    monkeypatch.setattr(commit, "INDEX_MAX_BYTES", 1000)
    with pytest.raises(StorageError, match=r"commit record's index would be .* MiB, above the 0 MiB"):
        _commit(open_store(location))
    assert not open_store(location).exists(layout.commit_path(bench.STEP))


@pytest.fixture(params=["seaweedfs", "moto"])
def s3_location(request, monkeypatch):
    """s3:// of a fresh prefix on SeaweedFS or moto (AWS_* pointing at it)."""
    if request.param == "seaweedfs":
        srv = request.getfixturevalue("s3_server")
        url = srv.fresh_url()
    else:
        try:
            find_moto_server()
        except FileNotFoundError as e:
            pytest.skip(str(e))
        srv = request.getfixturevalue("_moto")
        url = f"s3://{srv.bucket}/{request.node.name}"
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    return url


@pytest.fixture(scope="module")
def _moto():
    with MotoServer(port=free_port()) as srv:
        yield srv


@pytest.mark.s3
def test_an_index_of_4096_ranks_is_created_once_and_no_multipart_complete_replaces_it(s3_location):
    """The index of 4,096 ranks (2.5 MiB: tools/bench/scale_record.py) goes in one conditional PUT; both stores
    refuse a second one, and a conditional multipart complete on the existing key too (what s3fs would send
    above its 100 MiB single-PUT limit, which the index never reaches)."""
    store = open_store(s3_location, create=True)
    rel = layout.commit_path(bench.STEP)
    index = b"x" * (5 << 19)
    assert store.create_bytes(rel, index) and not store.create_bytes(rel, b"second")
    bucket, key = store.full(rel).split("/", 1)
    upload = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    etag = store.fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"y")["ETag"]
    with pytest.raises(Exception, match="(?i)pre-?condition"):
        store.fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload, IfNoneMatch="*",
                         MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert store.cat(rel) == index
