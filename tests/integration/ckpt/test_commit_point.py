"""The commit point on a store that ignores If-None-Match (rclone's `serve s3` answers a conditional PUT and a
conditional multipart complete on an existing key with 200 and replaces the object): the committer whose record
is there after its write has committed, the other keeps it; and the index stays below the single-PUT limit."""

from __future__ import annotations

import threading

import pytest

from slurm_titan.ckpt import commit, layout, manifest
from slurm_titan.ckpt.storage import open_store
from slurm_titan.errors import StorageError
from tools.bench import scale_record as bench

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
