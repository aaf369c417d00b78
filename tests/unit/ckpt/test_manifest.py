"""Commit records, receipts, names, retention rules, error messages: no storage needed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import CheckpointInfo
from slurm_titan.ckpt.manifest import (
    FORMAT_1,
    FileEntry,
    GatheredRef,
    Manifest,
    ManifestError,
    PartRef,
    Receipt,
    check_relpath,
)
from slurm_titan.ckpt.retention import plan_retention
from slurm_titan.ckpt.storage import describe, redact, scrub
from slurm_titan.errors import StorageError


@pytest.mark.parametrize("path", ["__0_0.distcp", ".metadata", "sharded/model-00001.safetensors", "a.b/c"])
def test_relpath_accepts_paths_inside_the_step(path):
    assert check_relpath(path) == path


@pytest.mark.parametrize("path", [
    "../x", "a/../../x", "..", "/etc/passwd", "~/x", "a//b", "./a", "a/./b", "a\\b", "", "C:x",
    ".slurm-titan/commit.json", "x\x00y", 5, None,
])
def test_relpath_refuses_paths_leaving_the_step(path):
    with pytest.raises(ManifestError):
        check_relpath(path)


def _manifest(**kw) -> Manifest:
    args = dict(step=100, world_size=2, algorithm="xxh3_128", config_digest="sha256:abc", attempt="a1",
                files=[FileEntry("__0_0.distcp", 10, "aa"), FileEntry("__1_0.distcp", 11, "bb"),
                       FileEntry(".metadata", 3, "cc")])
    args.update(kw)
    return Manifest(**args)


def test_manifest_round_trip():
    m = _manifest(saved_at="2026-01-01T00:00:00Z", committed_at="2026-01-01T00:00:01Z")
    back = Manifest.from_json(m.to_json(), step=100)
    assert back.files == sorted(m.files, key=lambda f: f.path)
    assert (back.step, back.world_size, back.total_bytes, back.config_digest) == (100, 2, 24, "sha256:abc")
    with pytest.raises(ManifestError, match="expected 7"):
        Manifest.from_json(m.to_json(), step=7)


@pytest.mark.parametrize("bad_path", ["../../outside", "/abs/file", "a/../../b"])
def test_manifest_with_escaping_path_is_refused(bad_path):
    body = json.loads(_manifest().to_json())
    body["files"][0]["path"] = bad_path
    with pytest.raises(ManifestError, match="refusing file path"):
        Manifest.from_json(json.dumps(body).encode())


@pytest.mark.parametrize("mutate", [
    lambda b: b.update(format="other/1"),
    lambda b: b.update(step=-1),
    lambda b: b.update(world_size=0),
    lambda b: b["files"].append(dict(b["files"][0])),
    lambda b: b["files"][0].update(size=-5),
    lambda b: b["files"][0].update(checksum=""),
    lambda b: b.update(files="x"),
])
def test_malformed_manifest_is_refused(mutate):
    body = json.loads(_manifest().to_json())
    mutate(body)
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(body).encode())
    with pytest.raises(StorageError):  # ManifestError is a StorageError: the CLI prints one line
        Manifest.from_json(b"{not json")


def test_receipt_round_trip():
    r = Receipt(5, 1, 2, "att", [FileEntry("__1_0.distcp", 4, "ff")], "xxh3_128", failed="")
    back = Receipt.from_json(r.to_json())
    assert back == r
    with_part = Receipt(5, 1, 2, "att", [], "xxh3_128", part=PartRef(layout.part_name(1, "ab" * 8), 9, "cc"))
    assert Receipt.from_json(with_part.to_json()) == with_part
    body = json.loads(with_part.to_json())
    body["part"][0] = layout.part_name(0, "ab" * 8)  # another rank's part
    with pytest.raises(ManifestError, match="bad part of rank 1"):
        Receipt.from_json(json.dumps(body).encode())


def _blocked(path: str, nblocks: int) -> FileEntry:
    return FileEntry(path, nblocks * 4096 - 1, f"{nblocks:032x}", 4096,
                     tuple(f"{nblocks * 100 + b:032x}" for b in range(nblocks)))


def _indexed(world: int = 2) -> Manifest:
    parts = [PartRef(layout.part_name(r, f"{r:016x}"), 10 + r, f"{r:032x}") for r in range(world)]
    files = [_blocked(f"__{r}_0.distcp", 3 + r) for r in range(world)] + [_blocked(".metadata", 1)]
    return _manifest(world_size=world, files=files, parts=parts)


def test_the_index_is_compact_its_block_checksums_one_string_a_file():
    m = _indexed()
    raw = m.to_json()
    assert raw.count(b"\n") == 1 and b" " not in raw and b"read_map" not in raw
    body = json.loads(raw)
    assert all(isinstance(f["blocks"], str) for f in body["files"])
    back = Manifest.from_json(raw, step=100)
    assert back.files == sorted(m.files, key=lambda f: f.path) and back.parts == m.parts and back.raw == raw
    assert back.gathered is None and b"gathered" not in raw  # none gathered: the record as before it existed
    gathered = GatheredRef(layout.spans_name("ab" * 8), 24, "c" * 32)
    assert Manifest.from_json(dataclasses.replace(m, gathered=gathered).to_json()).gathered == gathered
    shown = back.view([[("__0_0.distcp", 0, 5)], []])  # what `ckpt show --json` prints: format 1's shape
    assert all(isinstance(f["blocks"], list) for f in shown["files"])
    assert shown["read_map"][0] == [["__0_0.distcp", 0, 5]]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b["parts"].pop(), "'parts' does not hold one part per rank of 2"),
    (lambda b: b["parts"][1].__setitem__(0, "rank-00000.0000000000000000.json"), "bad part of rank 1"),
    (lambda b: b["parts"][0].__setitem__(0, "../../x.json"), "bad part of rank 0"),
    (lambda b: b["parts"][0].__setitem__(1, 0), "bad part of rank 0"),
    (lambda b: b.update(gathered=["spans.x.bin", 8, "c" * 32]), "bad 'gathered': \\['spans.x.bin'"),
    (lambda b: b.update(gathered=[layout.spans_name("ab" * 8), 0, "c" * 32]), "bad 'gathered'"),
    (lambda b: b["files"][1].update(blocks=b["files"][1]["blocks"][:-32]), "__0_0.distcp: bytes 0-12287: 2 block"),
    (lambda b: b["files"][0].update(blocks=b["files"][0]["blocks"] + "x"), "'blocks' is not a list of checksums"),
])
def test_a_malformed_index_is_refused_in_one_line(mutate, message):
    body = json.loads(_indexed().to_json())
    mutate(body)
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(json.dumps(body).encode())


def test_a_format1_record_is_read_never_written():
    body = dict(json.loads(_indexed().to_json()), format=FORMAT_1, read_map=[[["__0_0.distcp", 0, 10]], []])
    del body["parts"]
    m = Manifest.from_json(json.dumps(body).encode())
    assert m.format == FORMAT_1 and m.read_map == [[("__0_0.distcp", 0, 10)], []] and m.parts is None
    with pytest.raises(ManifestError, match="only read"):
        m.to_json()


def test_layout_names():
    assert layout.parse_step_dir("step-120") == 120
    assert layout.parse_step_dir("step-12x") is None
    assert layout.parse_step_dir(".uncommitted-5-1") is None
    entry = layout.catalog_entry(7, 8, 9, 12345)
    assert layout.parse_catalog_entry(entry.rsplit("/", 1)[1]) == (7, 8, 9, 12345)
    assert layout.file_owner("__3_0.distcp") == 3
    assert layout.file_owner("__12_4.distcp") == 12
    assert layout.file_owner("__5.metadata") == 5
    assert layout.file_owner(".metadata") == 0
    assert layout.file_owner("sharded/__3_0.distcp") == 0
    assert layout.parse_part_name(layout.part_name(12, "0123456789abcdef")) == 12
    assert layout.parse_part_name("rank-00012.json") is None and layout.parse_part_name("../rank-1.ab.json") is None


def _info(step, complete, t=0.0):
    return CheckpointInfo(step, complete, t, 1, 1, 1, f"x/step-{step}")


def test_retention_keeps_last_k_complete_and_never_counts_incomplete():
    infos = [_info(10, True), _info(20, True), _info(25, False), _info(30, True), _info(40, False)]
    plan = plan_retention(infos, keep_last=2)
    assert plan.delete == [10, 25]  # 25: incomplete and older than the newest complete (30)
    assert plan.keep == [20, 30, 40]  # 40: incomplete but newer: may still be uploading
    assert "newest complete" in plan.reasons[30]


def test_retention_keep_every_and_newest_complete():
    infos = [_info(s, True) for s in (100, 200, 300, 400, 500)] + [_info(600, False)]
    plan = plan_retention(infos, keep_last=1, keep_every=200)
    assert plan.keep == [200, 400, 500, 600]
    assert plan.delete == [100, 300]


def test_retention_never_deletes_newest_complete_or_protected_or_fresh_incomplete():
    infos = [_info(1, False, t=1000.0), _info(2, True), _info(3, False, t=900.0), _info(4, True), _info(5, False)]
    plan = plan_retention(infos, keep_last=1, protected={2}, grace=60, now=1030.0)
    assert 4 in plan.keep and 2 in plan.keep  # newest complete; protected (upload in progress)
    assert 1 in plan.keep  # incomplete but written 30 s ago (< grace)
    assert plan.delete == [3]
    # with no complete checkpoint at all nothing is deleted
    assert plan_retention([_info(1, False), _info(2, False)], keep_last=1).delete == []


def test_error_messages_hide_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "TOPSECRETVALUE123")
    assert redact("s3://user:pw@bucket/x?X-Amz-Signature=abc") == "s3://***@bucket/x"
    assert "TOPSECRETVALUE123" not in scrub("denied for TOPSECRETVALUE123")
    msg = describe(RuntimeError("boom\nsecond line TOPSECRETVALUE123"))
    assert "\n" not in msg and "TOPSECRETVALUE123" not in msg


def test_a_record_names_the_attempt_folder_of_its_files_and_a_restored_copy_names_none():
    files = [FileEntry("__0_0.distcp", 3, "c")]
    m = Manifest.from_json(Manifest(7, 1, files, "xxh3_128", attempt="4711.1", data_dir="attempt-4711.1").to_json())
    assert m.key("__0_0.distcp") == "step-7/attempt-4711.1/__0_0.distcp" == layout.data_key(
        7, layout.attempt_dir("4711.1"), "__0_0.distcp")
    copy = Manifest.from_json(m.local_copy())
    assert (copy.data_dir, copy.key("__0_0.distcp"), copy.files, copy.attempt) == ("", "step-7/__0_0.distcp", files,
                                                                                   "4711.1")
    before = Manifest.from_json(Manifest(7, 1, files, "xxh3_128", attempt="4711.0").to_json())  # no data_dir
    assert before.key("__0_0.distcp") == "step-7/__0_0.distcp" and before.local_copy() == before.raw
    assert layout.attempt_dir("") == "" and layout.attempt_dir("elastic-x/y").startswith("attempt-")
    body = json.loads(m.raw) | {"data_dir": "../elsewhere"}
    with pytest.raises(StorageError, match="bad 'data_dir': '../elsewhere'"):
        Manifest.from_json(json.dumps(body).encode())
