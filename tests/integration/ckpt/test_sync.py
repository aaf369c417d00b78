"""Background upload + commit of multi-rank checkpoints, against a directory and SeaweedFS.

Ranks are simulated in one process: one CheckpointSync per rank, all sharing one local
folder (the files of each rank are told apart by name, as on a shared node-local disk).
"""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from slurm_titan import envvars
from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import list_checkpoints, read_manifest, verify
from slurm_titan.ckpt.manifest import Receipt
from slurm_titan.ckpt.restore import restore_checkpoint
from slurm_titan.ckpt.storage import TransferConfig, open_store
from slurm_titan.ckpt.upload import CheckpointSync, Uploader
from slurm_titan.ckpt.upload_process import UploadSettings
from slurm_titan.errors import StorageError
from slurm_titan.retention import Retention
from tests.support.ckpt import committed_key, write_fake_step


def _ranks(location, local, world_size, attempt="attempt-1", **kw):
    kw.setdefault("retry_initial", 0.1)
    kw.setdefault("poll_interval", 0.1)
    return [CheckpointSync(location, str(local), rank=r, world_size=world_size, attempt=attempt,
                           config_digest="sha256:cfg", **kw) for r in range(world_size)]


def _close(syncs):
    for s in syncs:
        assert s.close(timeout=30)


def test_upload_and_commit_multi_rank(location, tmp_path):
    local = tmp_path / "local"
    syncs = _ranks(location, local, world_size=3)
    assert all(isinstance(s, Uploader) for s in syncs)
    written = {}
    for step in (10, 20):
        written[step] = write_fake_step(local, step, world_size=3)
        for s in syncs:
            s.submit(step)
    for s in syncs:
        assert s.wait(timeout=30)
    assert [syncs[0].status(s) for s in (10, 20)] == ["committed", "committed"]
    assert syncs[1].status(10) == "uploaded"
    _close(syncs)

    store = open_store(location)
    infos = list_checkpoints(store)
    assert [(i.step, i.complete, i.world_size, i.files) for i in infos] == [(10, True, 3, 4), (20, True, 3, 4)]
    assert infos[1].size == sum(len(v) for v in written[20].values())
    m = read_manifest(store, 20)
    assert sorted(f.path for f in m.files) == sorted(written[20])
    assert (m.world_size, m.config_digest, m.attempt) == (3, "sha256:cfg", "attempt-1")
    assert m.committed_at and m.saved_at
    assert verify(store, 20).ok
    result = restore_checkpoint(store, str(tmp_path / "restored"))
    assert result.step == 20 and not result.skipped
    for name, data in written[20].items():
        assert (tmp_path / "restored" / "step-20" / name).read_bytes() == data


def test_commit_only_after_all_receipts(location, tmp_path):
    local = tmp_path / "local"
    r0, r1 = _ranks(location, local, world_size=2)
    write_fake_step(local, 5, world_size=2)
    r0.submit(5)
    assert r0.wait(timeout=1.0) is False  # rank 0 uploaded, rank 1 has not: no commit
    store = open_store(location)
    assert store.exists(layout.receipt_path(5, 0, "attempt-1"))
    assert not store.exists(layout.commit_path(5))
    [info] = list_checkpoints(store)
    assert not info.complete and "receipt" in info.detail
    with pytest.raises(StorageError, match="no complete checkpoint"):
        restore_checkpoint(store, str(tmp_path / "r"))
    with pytest.raises(StorageError, match="incomplete"):
        restore_checkpoint(store, str(tmp_path / "r"), step=5)
    assert not (tmp_path / "r" / "step-5").exists()

    r1.submit(5)
    assert r1.wait(timeout=30) and r0.wait(timeout=30)
    assert list_checkpoints(store)[0].complete
    _close([r0, r1])


def test_receipts_of_an_earlier_attempt_do_not_count(location, tmp_path):
    local = tmp_path / "local"
    store = open_store(location, create=True)
    stale = Receipt(7, 1, 2, "old-attempt", [], "xxh3_128")
    store.put_bytes(layout.receipt_path(7, 1, stale.attempt), stale.to_json())
    r0, r1 = _ranks(location, local, world_size=2, attempt="new-attempt")
    write_fake_step(local, 7, world_size=2)
    r0.submit(7)
    assert r0.wait(timeout=1.0) is False
    assert not store.exists(layout.commit_path(7))
    r1.submit(7)
    assert r0.wait(timeout=30)
    assert read_manifest(store, 7).attempt == "new-attempt"
    _close([r0, r1])


def test_step_already_committed_is_kept(location, tmp_path):
    first = write_fake_step(tmp_path / "a", 9, world_size=1, seed=1)
    [s] = _ranks(location, tmp_path / "a", 1, attempt="one")
    s.submit(9)
    assert s.wait(timeout=30)
    _close([s])
    write_fake_step(tmp_path / "b", 9, world_size=1, seed=2)
    [s2] = _ranks(location, tmp_path / "b", 1, attempt="two")
    s2.submit(9)
    assert s2.wait(timeout=30)
    assert s2.status(9) == "already-committed"
    store = open_store(location)
    assert read_manifest(store, 9).attempt == "one"
    assert store.cat(committed_key(store, 9, "__0_0.distcp")) == first["__0_0.distcp"]
    _close([s2])


def test_rank_without_its_files_leaves_step_incomplete(location, tmp_path):
    local = tmp_path / "local"
    r0, r1 = _ranks(location, local, world_size=2)
    write_fake_step(local, 3, world_size=2)
    r0.submit(3)
    r1.local_folder = str(tmp_path / "elsewhere")  # rank 1's node lost its files
    r1.submit(3)
    assert r1.wait(timeout=30) is False and r1.status(3).startswith("failed")
    assert r0.wait(timeout=30) is False and "rank 1" in r0.status(3)
    [info] = list_checkpoints(open_store(location))
    assert not info.complete
    for s in (r0, r1):
        s.close(timeout=10)


def test_remote_and_local_retention(location, tmp_path):
    local = tmp_path / "local"
    syncs = _ranks(location, local, world_size=2, retention=Retention(keep_remote=2, keep_every=20, keep_local=1))
    for step in (10, 20, 30, 40, 50):
        write_fake_step(local, step, world_size=2)
        for s in syncs:
            s.submit(step)
        for s in syncs:
            assert s.wait(step, timeout=30)
    _close(syncs)
    store = open_store(location)
    infos = list_checkpoints(store)
    assert [(i.step, i.complete) for i in infos] == [(20, True), (40, True), (50, True)]
    assert sorted(os.listdir(local)) == ["step-50"]  # older local steps deleted once uploaded
    assert sorted(os.listdir(local / "step-50")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.s3
def test_credentials_never_in_records_or_logs(s3_env, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="slurm_titan")
    location = s3_env.fresh_url()
    syncs = _ranks(location, tmp_path / "local", world_size=2, retention=Retention(keep_remote=1))
    for step in (1, 2):
        write_fake_step(tmp_path / "local", step, world_size=2)
        for s in syncs:
            s.submit(step)
    for s in syncs:
        assert s.wait(timeout=30)
    _close(syncs)
    store = open_store(location)
    blobs = store.cat_many([e.path for e in store.find("") if ".slurm-titan" in e.path])
    assert blobs
    text = caplog.text + "".join(b.decode() for b in blobs.values()) + repr(store)
    assert s3_env.secret_key not in text and s3_env.access_key not in text
    assert "committed" in caplog.text


def test_upload_and_commit_threads_yield_the_cpu_to_training(tmp_path):
    local = tmp_path / "local"
    upload_cpu = max(os.sched_getaffinity(0))
    syncs = _ranks(str(tmp_path / "remote"), local, world_size=1, nice=7, upload_cpus=frozenset({upload_cpu}))
    write_fake_step(local, 10, world_size=1)
    syncs[0].submit(10)
    assert syncs[0].wait(timeout=30)
    training = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for thread in (syncs[0]._uploader, syncs[0]._committer):
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(19, training + 7), thread.name
        assert os.sched_getaffinity(thread.native_id) == {upload_cpu}, thread.name
    assert len(os.sched_getaffinity(threading.get_native_id())) == os.cpu_count()  # training's thread: untouched
    _close(syncs)


@pytest.mark.s3
def test_each_rank_paces_its_uploads_at_its_share_of_the_upload_rate(s3_env, tmp_path, monkeypatch):
    monkeypatch.setenv(envvars.CKPT_PART_MB, "5")  # a file of 12 MiB: 3 parts
    location, local = s3_env.fresh_url(), tmp_path / "local"
    sent = [UploadSettings(remote=location, local_folder=str(local), rank=r, world_size=3, attempt="a",
                           upload_rate=30.0) for r in range(3)]
    syncs = [CheckpointSync.from_settings(UploadSettings.from_message(json.loads(json.dumps(s.to_message()))))
             for s in sent]  # as the uploader process gets them
    assert [s.store.upload_pace.gap for s in syncs] == [pytest.approx(0.1)] * 3  # 10 uploads a second each
    write_fake_step(local, 5, world_size=3, size=12 << 20)
    for s in syncs:
        s.submit(5)
    _close(syncs)
    assert syncs[0].status(5) == "committed"
    assert verify(open_store(location), 5).ok
    reader = open_store(location, transfer=TransferConfig(upload_rate=0.1))  # reads are not paced: a restore,
    got = reader.read_ranges([(layout.data_key(5, layout.attempt_dir("a"), f"__{r}_0.distcp"), 0, 8) for r in range(3)])
    assert len(got) == 3 and reader.upload_pace.next is None  # the committer gathering small items
