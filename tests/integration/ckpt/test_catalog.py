"""list / show / verify / restore / prune, through the API and the CLI, on a directory and SeaweedFS."""

from __future__ import annotations

import json
import os

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import list_checkpoints, verify
from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM, hash_bytes
from slurm_titan.ckpt.manifest import FileEntry, Manifest, ManifestError
from slurm_titan.ckpt.restore import CorruptCheckpoint, restore_checkpoint
from slurm_titan.ckpt.storage import LocalStore, open_store
from slurm_titan.ckpt.upload import CheckpointSync
from slurm_titan.cli.main import main as ckpt_main
from slurm_titan.errors import StorageError
from tests.support.ckpt import committed_key, write_fake_step


def _commit_steps(location, local, steps, world_size=2, size=4096, data_path=None):
    remote = (lambda: open_store(location, create=True, data_path=data_path)) if data_path else (lambda: location)
    syncs = [CheckpointSync(remote(), str(local), rank=r, world_size=world_size, attempt="a",
                            retry_initial=0.1, poll_interval=0.05) for r in range(world_size)]
    files = {}
    for step in steps:
        files[step] = write_fake_step(local, step, world_size, size=size)
        for s in syncs:
            s.submit(step)
    for s in syncs:
        assert s.wait(timeout=30)
        assert s.close(timeout=30)
    return files


def _overwrite(store, rel, data):
    store.put_bytes(rel, data)


def test_verify_names_corrupted_and_truncated_shards(location, tmp_path, capsys):
    files = _commit_steps(location, tmp_path / "local", [1])[1]
    store = open_store(location)
    assert verify(store, 1).ok
    flipped = bytearray(files["__0_0.distcp"])
    flipped[100] ^= 0xFF
    _overwrite(store, committed_key(store, 1, "__0_0.distcp"), bytes(flipped))  # same size, different bytes
    _overwrite(store, committed_key(store, 1, "__1_0.distcp"), files["__1_0.distcp"][:1000])  # truncated
    report = verify(store)
    assert not report.ok
    bad = dict(report.bad)
    assert set(bad) == {"__0_0.distcp", "__1_0.distcp"}
    assert "checksum mismatch" in bad["__0_0.distcp"] and "truncated" in bad["__1_0.distcp"]

    assert ckpt_main(["ckpt", "verify", location, "--step", "1", "--quiet"]) == 5
    out = capsys.readouterr().out
    assert "__0_0.distcp: checksum mismatch" in out and "__1_0.distcp: truncated" in out
    # a corrupt checkpoint is never restored when asked for by step
    with pytest.raises(CorruptCheckpoint, match="__1_0.distcp"):
        restore_checkpoint(store, str(tmp_path / "r"), step=1)
    assert not (tmp_path / "r" / "step-1").exists()


def test_restore_falls_back_to_previous_complete(location, tmp_path, capsys):
    files = _commit_steps(location, tmp_path / "local", [10, 20, 30])
    store = open_store(location)
    # an incomplete newer step (an upload cut short) is never restored
    write_fake_step(tmp_path / "other", 40, 2)
    store.upload_many([(str(tmp_path / "other" / "step-40" / "__0_0.distcp"), "step-40/__0_0.distcp")])
    _overwrite(store, committed_key(store, 30, "__1_0.distcp"), b"garbage" * 10)
    notes = []
    result = restore_checkpoint(store, str(tmp_path / "dest"), notify=notes.append)
    assert result.step == 20
    assert [s for s, _ in result.skipped] == [30]
    assert len(notes) == 1 and "step 30 is corrupt" in notes[0] and "falling back to step 20" in notes[0]
    for name, data in files[20].items():
        assert (tmp_path / "dest" / "step-20" / name).read_bytes() == data
    assert not (tmp_path / "dest" / "step-30").exists() and not (tmp_path / "dest" / "step-40").exists()
    assert sorted(os.listdir(tmp_path / "dest")) == ["step-20"]  # no partial folders left

    # the restored folder is itself a location: listed complete, verifies
    local = open_store(str(tmp_path / "dest"))
    assert [(i.step, i.complete) for i in list_checkpoints(local)] == [(20, True)]
    assert verify(local, 20).ok
    # restoring again reuses the intact local copy
    assert restore_checkpoint(store, str(tmp_path / "dest"), step=20).reused

    # the CLI says so on stderr and restores
    assert ckpt_main(["ckpt", "restore", location, "--to", str(tmp_path / "cli")]) == 0
    cap = capsys.readouterr()
    assert "falling back to step 20" in cap.err and "restore" in cap.err  # warning + progress
    assert "checkpoint step 20" in cap.out


def test_commit_record_with_escaping_path_is_refused(location, tmp_path):
    store = open_store(location, create=True)
    evil = b"pwned"
    store.put_bytes("step-5/__0_0.distcp", evil)
    m = Manifest(step=5, world_size=1, algorithm=DEFAULT_ALGORITHM,
                 files=[FileEntry("__0_0.distcp", len(evil), hash_bytes(evil))])
    body = json.loads(m.to_json())
    body["files"][0]["path"] = "../../escaped.txt"
    store.create_bytes(layout.commit_path(5), json.dumps(body).encode())
    store.put_bytes(layout.catalog_entry(5, 1, 1, len(evil)), b"{}")
    dest = tmp_path / "a" / "b"
    with pytest.raises(StorageError, match="every complete checkpoint is corrupt: step 5: .*refusing file path"):
        restore_checkpoint(store, str(dest))  # a bad record is a corrupt checkpoint: the restore falls back past it
    with pytest.raises(ManifestError):
        verify(store, 5)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "a" / "escaped.txt").exists()


def test_cli_list_show_prune(location, tmp_path, capsys):
    _commit_steps(location, tmp_path / "local", [100, 200, 300, 400], world_size=2)
    store = open_store(location)
    write_fake_step(tmp_path / "x", 150, 1)
    store.upload_many([(str(tmp_path / "x" / "step-150" / "__0_0.distcp"), "step-150/__0_0.distcp")])  # incomplete

    assert ckpt_main(["ckpt", "list", location, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(c["step"], c["status"], c["world_size"], c["files"]) for c in listed] == [
        (100, "complete", 2, 3), (150, "incomplete", None, 1), (200, "complete", 2, 3), (300, "complete", 2, 3),
        (400, "complete", 2, 3)]
    assert listed[0]["where"].endswith("/step-100") and listed[0]["size"] > 8192 and listed[0]["time"]

    assert ckpt_main(["ckpt", "list", location]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["STEP", "STATUS", "TIME"] and len(table) == 6

    assert ckpt_main(["ckpt", "show", location, "300"]) == 0
    out = capsys.readouterr().out
    assert "world size:    2" in out and "__1_0.distcp" in out
    assert ckpt_main(["ckpt", "show", location, "150"]) == 4
    assert "incomplete" in capsys.readouterr().err

    assert ckpt_main(["ckpt", "prune", location, "--keep", "2", "--keep-every", "200", "--dry-run",
                      "--grace", "0"]) == 0
    out = capsys.readouterr().out
    assert "would delete step 100" in out and "would delete step 150" in out
    assert len(list_checkpoints(store)) == 5
    assert ckpt_main(["ckpt", "prune", location, "--keep", "1", "--grace", "0"]) == 0
    capsys.readouterr()
    assert [(i.step, i.complete) for i in list_checkpoints(store)] == [(400, True)]
    assert verify(store, 400).ok


def _fake_committed(store, steps, files_per_step=2):
    """Write committed-looking checkpoints straight into the store (fast, for listing tests)."""
    objs = {}
    for step in steps:
        data = b"x" * 16
        entries = [FileEntry(f"__{r}_0.distcp", len(data), hash_bytes(data)) for r in range(files_per_step)]
        for e in entries:
            objs[f"{layout.step_dir(step)}/{e.path}"] = data
        m = Manifest(step=step, world_size=files_per_step, files=entries, algorithm=DEFAULT_ALGORITHM)
        objs[layout.commit_path(step)] = m.to_json()
        objs[layout.catalog_entry(step, files_per_step, len(entries), m.total_bytes)] = b"{}"
    if isinstance(store, LocalStore):
        for rel, data in objs.items():
            store.put_bytes(rel, data)
    else:  # one batched PUT per object, concurrently
        store.fs.pipe({store.full(rel): data for rel, data in objs.items()})


@pytest.mark.s3
def test_list_uses_a_constant_number_of_list_requests(s3_env, tmp_path):
    counts = {}
    for n in (5, 200):
        location = s3_env.fresh_url("many")
        store = open_store(location)
        _fake_committed(store, range(1, n + 1), files_per_step=1)
        store.put_bytes(f"step-{n + 1}/__0_0.distcp", b"partial")  # one incomplete: one more listing
        store.count_requests()
        infos = list_checkpoints(store)
        assert len(infos) == n + 1 and sum(i.complete for i in infos) == n
        counts[n] = dict(store.request_counts)
    print("LIST COUNTS", counts)
    assert counts[5] == counts[200], counts
    assert counts[200].get("ListObjectsV2", 0) <= 3 and sum(counts[200].values()) <= 3, counts


@pytest.mark.s3
@pytest.mark.parametrize("data_path", ["http", "fsspec"])
def test_s3_transfer_paths(s3_env, tmp_path, monkeypatch, data_path):
    """Every S3 data path (http.client with presigned URLs; s3fs) uploads (multipart where it
    splits files), restores, verifies, and reports a vanished object as one line."""
    from slurm_titan.ckpt.storage import TransferConfig, s3_http
    from slurm_titan.errors import StorageError

    monkeypatch.setattr(s3_http, "_RANGED_MIN", 1 << 20)
    location = s3_env.fresh_url()
    files = _commit_steps(location, tmp_path / "local", [1], world_size=2, size=3 << 20, data_path=data_path)[1]
    # small parts, so that multipart uploads and ranged downloads happen with small objects
    store = open_store(location, transfer=TransferConfig(part_size=5 << 20, concurrency=3, file_concurrency=2),
                       data_path=data_path)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 << 20))
    [entry] = store.upload_many([(str(big), "step-1/__9_0.distcp")])
    assert entry.size == 11 << 20 and store.cat("step-1/__9_0.distcp") == big.read_bytes()
    store.rm_files(["step-1/__9_0.distcp"])
    store.transfer.part_size = 1 << 20
    result = restore_checkpoint(store, str(tmp_path / "dest"))
    for name, data in files.items():
        assert (tmp_path / "dest" / "step-1" / name).read_bytes() == data
    assert verify(store, 1).ok
    with pytest.raises(StorageError) as e:
        store.download_many([("step-1/nope.distcp", str(tmp_path / "x"), None)])
    assert "\n" not in str(e.value) and s3_env.access_key not in str(e.value)
    assert result.step == 1


def test_list_of_a_restored_folder_reads_its_commit_record(tmp_path, monkeypatch, capsys):
    """A folder made by `ckpt restore` has the commit record but no receipts or catalog entry:
    its world size and time are the record's, not `?` and the time of the restore."""
    remote = str(tmp_path / "remote")
    _commit_steps(remote, tmp_path / "local", [7], world_size=3)
    store = open_store(remote)
    committed = Manifest.from_json(store.cat(layout.commit_path(7)))
    committed.committed_at = "2024-01-02T03:04:05Z"  # an old commit: not the time of the restore below
    _overwrite(store, layout.commit_path(7), committed.to_json())
    restore_checkpoint(store, str(tmp_path / "dest"))

    [info] = list_checkpoints(open_store(str(tmp_path / "dest")))
    assert (info.step, info.complete, info.world_size, info.files) == (7, True, 3, 4)
    assert info.to_dict()["time"] == "2024-01-02T03:04:05Z"
    assert ckpt_main(["ckpt", "list", str(tmp_path / "dest")]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:7] == ["7", "complete", "2024-01-02", "03:04:05", "12.0", "KiB", "4"] and row[7] == "3"
