"""Fenced attempts, on SeaweedFS with the real uploader processes: an uploader of attempt A frozen (SIGSTOP) while
it uploads step 5, attempt B uploading and committing step 5, then A thawed (SIGCONT) and left to finish: A writes
only into its own attempt's folder, so step 5 still verifies and restores byte for byte to B's data; a prune that
keeps the step removes what A left in it, one that does not keep it deletes both attempts' objects."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from slurm_titan.ckpt import layout, list_checkpoints, open_store, prune, read_manifest, restore_checkpoint, verify
from slurm_titan.ckpt.upload_process import UploaderProcess, UploadSettings
from tests.support.ckpt import write_fake_step

pytestmark = pytest.mark.s3
SIZE = 48 << 20  # long enough to upload that A is frozen before it is done


def _read_chars(pid: int) -> int:
    """Bytes process `pid` has read so far (its uploads read the local files)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"])


def _uploader(location: str, local: Path, attempt: str) -> UploaderProcess:
    """Started and ready: its imports read files too, which the test counts as the upload's reads otherwise."""
    uploader = UploaderProcess(UploadSettings(remote=location, local_folder=str(local), attempt=attempt))
    uploader.ready()
    return uploader


def test_a_stale_attempt_thawed_after_a_newer_one_committed_the_step_overwrites_nothing(s3_env, tmp_path):
    location = s3_env.fresh_url()
    store = open_store(location)
    stale, newer = "4711.0", "4711.1"
    a_files = write_fake_step(tmp_path / "a", 5, world_size=1, size=SIZE, seed=1)
    b_files = write_fake_step(tmp_path / "b", 5, world_size=1, size=SIZE, seed=2)
    a = _uploader(location, tmp_path / "a", stale)
    before = _read_chars(a.pid)
    a.submit(5)
    deadline = time.monotonic() + 60
    while _read_chars(a.pid) - before < (4 << 20):  # A reads its shard to send it: it is uploading
        assert time.monotonic() < deadline, "attempt A never started its upload"
        time.sleep(0.002)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        assert not store.exists(layout.receipt_path(5, 0, stale))  # frozen before its upload was done

        b = _uploader(location, tmp_path / "b", newer)
        b.submit(5)
        assert b.wait(5, timeout=120) and b.status(5) == "committed"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.wait(5, timeout=120) and a.status(5) == "already-committed"  # its committer keeps B's record
    assert a.close(timeout=60)

    m = read_manifest(store, 5)
    assert (m.attempt, m.data_dir) == (newer, layout.attempt_dir(newer))
    stale_shard = layout.data_key(5, layout.attempt_dir(stale), "__0_0.distcp")
    assert store.cat(stale_shard) == a_files["__0_0.distcp"]  # A did finish: beside the record's, not over it
    assert verify(store, 5).ok
    restored = restore_checkpoint(store, str(tmp_path / "restored"))
    assert restored.step == 5 and not restored.skipped
    for name, data in b_files.items():
        assert (tmp_path / "restored" / "step-5" / name).read_bytes() == data
    assert verify(open_store(str(tmp_path / "restored")), 5).ok  # the local copy: its files in its step folder

    write_fake_step(tmp_path / "b", 6, world_size=1, size=4096, seed=3)
    b.submit(6)
    assert b.wait(6, timeout=120) and b.close(timeout=60)
    swept = prune(store, keep_last=2, sweep=True).swept  # both kept: only what A left in step 5 goes
    assert swept == {5: [layout.step_dir(5) + "/" + layout.attempt_dir(stale),
                         layout.receipt_dir(5, stale)]}, swept
    assert not store.exists(stale_shard) and store.exists(m.key("__0_0.distcp"))
    assert verify(store, 5).ok and verify(store, 6).ok
    prune(store, keep_last=1)
    assert [i.step for i in list_checkpoints(store)] == [6]
    assert store.find(layout.step_dir(5)) == []  # both attempts' objects of the pruned step
    assert verify(store, 6).ok
