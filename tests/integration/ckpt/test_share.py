"""Block checksums in the commit record, a node's share restored and verified range by range, bad
records refused with one line, and one verdict for all nodes (no torch: read maps written by hand)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.agree import NodeAgreement
from slurm_titan.ckpt.catalog import read_manifest, verify
from slurm_titan.ckpt.checksum import BlockHasher, hash_bytes
from slurm_titan.ckpt.commit import gather_spans
from slurm_titan.ckpt.fetch_plan import Wanted
from slurm_titan.ckpt.manifest import FileEntry, ManifestError
from slurm_titan.ckpt.parts import all_reads, part_bytes
from slurm_titan.ckpt.restore import restore_checkpoint
from slurm_titan.ckpt.share import SHARE_FILE, Share, node_ranks
from slurm_titan.ckpt.storage import open_store
from slurm_titan.ckpt.upload import CheckpointSync
from slurm_titan.cli.main import main as ckpt_main
from slurm_titan.errors import StorageError
from slurm_titan.records.held_folder import HeldFolder
from tests.support.ckpt import committed_key, write_fake_step

BLOCK = 8192
SIZE = 5 * BLOCK + 100  # __R_0.distcp is SIZE + R bytes: 6 blocks, the last one short


def _reads(world: int) -> list[list[tuple[str, int, int]]]:
    """Each rank reads its own file whole and the .metadata-like replicated bytes that the save put in
    rank 0's file: bytes [3 * BLOCK + 10, 3 * BLOCK + 50) (block 3)."""
    return [[(f"__{r}_0.distcp", 0, SIZE + r)] + ([("__0_0.distcp", 3 * BLOCK + 10, 40)] if r else [])
            for r in range(world)]


ITEM = (3 * BLOCK + 10, 40)  # the small item of rank 0's file that the other ranks read


def _commit(location, local, steps, world=2, reads=True, monkeypatch=None, spans=False):
    if monkeypatch is not None:
        monkeypatch.setenv("SLURM_TITAN_CKPT_BLOCK_KB", str(BLOCK // 1024))
    syncs = [CheckpointSync(location, str(local), rank=r, world_size=world, attempt="a", retry_initial=0.1,
                            poll_interval=0.05) for r in range(world)]
    files = {}
    for step in steps:
        files[step] = write_fake_step(local, step, world, size=SIZE, seed=step)
        for r, s in enumerate(syncs):
            s.submit(step, _reads(world)[r] if reads else None, {"__0_0.distcp": [ITEM]} if spans and r == 0 else None)
    for s in syncs:
        assert s.close(timeout=60)
    return files


def _edit_record(store, step, edit):
    body = json.loads(store.cat(layout.commit_path(step)))
    edit(body)
    store.rm_files([layout.commit_path(step)])
    assert store.create_bytes(layout.commit_path(step), json.dumps(body).encode())


def _edit_part(store, step, rank, edit):
    """Rewrite rank's part with edit(reads) applied, and the index to name it (its size and checksum)."""
    name = json.loads(store.cat(layout.commit_path(step)))["parts"][rank][0]
    reads = json.loads(store.cat(layout.part_path(step, name)))["reads"]
    edit(reads)
    data = part_bytes(step, rank, [tuple(r) for r in reads])
    store.put_bytes(layout.part_path(step, name), data)
    _edit_record(store, step, lambda b: b["parts"][rank].__setitem__(slice(1, 3), [len(data), hash_bytes(data)]))


def _corrupt(store, rel, offset):
    data = bytearray(store.cat(rel))
    data[offset] ^= 0xFF
    store.put_bytes(rel, bytes(data))


@pytest.mark.parametrize("pieces", [1, 100, 4096, BLOCK, 3 * BLOCK + 7])
def test_block_checksums_come_from_the_same_pass(pieces):
    data = os.urandom(4 * BLOCK + 123)
    h = BlockHasher("xxh3_128", BLOCK)
    for i in range(0, len(data), pieces):
        h.update(data[i:i + pieces])
    assert h.hexdigest() == hash_bytes(data, "xxh3_128")
    assert h.block_digests() == tuple(hash_bytes(data[i:i + BLOCK], "xxh3_128") for i in range(0, len(data), BLOCK))


def test_upload_records_block_checksums_and_the_read_map(location, tmp_path, monkeypatch):
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    store = open_store(location)
    m = read_manifest(store, 10)
    for f in m.files:
        data = files[f.path]
        assert f.block_size == BLOCK
        assert list(f.blocks) == [hash_bytes(data[i:i + BLOCK], m.algorithm) for i in range(0, len(data), BLOCK)]
    assert all_reads(store, m) == [sorted(r) for r in _reads(2)]
    index = store.cat(layout.commit_path(10))
    assert b" " not in index and b"read_map" not in index and index.count(b"\n") == 1  # compact, the parts named


def test_each_node_fetches_only_its_share_verified(location, tmp_path, monkeypatch):
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    store = open_store(location)
    res = restore_checkpoint(store, str(tmp_path / "node1"), wanted=Wanted([1], 2))
    assert res.share.whole == [".metadata", "__1_0.distcp"] and res.share.blocks == {"__0_0.distcp": [3]}
    assert res.fetched == len(files[".metadata"]) + len(files["__1_0.distcp"]) + BLOCK
    folder = tmp_path / "node1" / "step-10"
    partial = (folder / "__0_0.distcp").read_bytes()
    assert len(partial) == len(files["__0_0.distcp"])  # sparse, at the offsets DCP reads
    assert partial[3 * BLOCK:4 * BLOCK] == files["__0_0.distcp"][3 * BLOCK:4 * BLOCK]
    assert partial[:3 * BLOCK] == bytes(3 * BLOCK)
    assert (folder / "__1_0.distcp").read_bytes() == files["__1_0.distcp"]
    assert json.loads((folder / layout.META_DIR / "share.json").read_bytes())["ranks"] == [1]
    again = restore_checkpoint(store, str(tmp_path / "node1"), wanted=Wanted([1], 2))
    assert again.reused and again.share == res.share
    other_size = restore_checkpoint(store, str(tmp_path / "resharded"), wanted=Wanted([0], 4))  # another world size
    assert other_size.share is None and other_size.fetched == read_manifest(store, 10).total_bytes


def test_old_record_without_block_checksums_restores_whole(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    store = open_store(location)

    def old(body):
        body.pop("parts")
        for f in body["files"]:
            f.pop("block_size"), f.pop("blocks")

    _edit_record(store, 10, old)
    res = restore_checkpoint(store, str(tmp_path / "node0"), wanted=Wanted([0], 2))
    assert res.share is None and res.fetched == sum(map(len, files.values()))
    assert all((tmp_path / "node0" / "step-10" / p).read_bytes() == d for p, d in files.items())
    entry = read_manifest(store, 10).files[0]
    with pytest.raises(ManifestError, match="no block checksums"):
        entry.covering_blocks(0, 1)


PART = r"step-11/.slurm-titan/parts/rank-0000{}\.[0-9a-f]+\.json: "


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: _edit_record(s, 11, lambda b: b["files"][1].update(blocks=b["files"][1]["blocks"][:-32])),
     r"step-11/.slurm-titan/commit.json: __0_0.distcp: bytes 0-41060: 5 block checksum\(s\) for 41060 bytes"),
    (lambda s: _edit_part(s, 11, 1, lambda reads: reads.append(["__0_0.distcp", SIZE - 10, 20])),
     PART.format(1) + r"__0_0.distcp: bytes 41050-41070 are outside the file \(41060 bytes\)"),
    (lambda s: _edit_part(s, 11, 0, lambda reads: reads.append(["__7_0.distcp", 0, 5])),
     PART.format(0) + r"rank 0 reads bytes 0-5 of __7_0.distcp, a file missing from the record"),
    (lambda s: s.put_bytes(layout.part_path(11, json.loads(s.cat(layout.commit_path(11)))["parts"][0][0]), b"{}\n"),
     PART.format(0) + r"the part of rank 0 is not the one the commit record names \(3 bytes, expected \d+"),
    (lambda s: s.rm_files([layout.part_path(11, json.loads(s.cat(layout.commit_path(11)))["parts"][0][0])]),
     PART.format(0) + r"the part of rank 0 named by the commit record is missing"),
])
def test_bad_record_is_refused_in_one_line_and_the_restore_falls_back(tmp_path, monkeypatch, caplog, edit, message):
    location = str(tmp_path / "remote")
    _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch)
    store = open_store(location)
    key = committed_key(store, 11, "__0_0.distcp")
    edit(store)
    res = restore_checkpoint(store, str(tmp_path / "node0"), wanted=Wanted([0, 1], 2))  # reads both parts
    assert res.step == 10 and len(res.skipped) == 1
    assert "\n" not in res.skipped[0][1]
    import re
    assert re.search(message, res.skipped[0][1]), res.skipped[0][1]
    assert store.exists(key) and store.exists(layout.commit_path(11))  # nothing deleted


def _restore_on_nodes(tmp_path, locations, options):
    """Node k restores from ``locations[k]`` into ``node<k>`` with ``options(k)``, all at once (threads), agreeing
    through one job folder; their results by node (an error on any node fails the test)."""
    results, errors = {}, {}

    def node(k):
        try:
            with HeldFolder(tmp_path / "job" / "restore") as verdicts:
                results[k] = restore_checkpoint(open_store(locations[k]), str(tmp_path / f"node{k}"), **options(k),
                                                agree=NodeAgreement(verdicts, k, len(locations), timeout_s=60))
        except Exception as e:  # noqa: BLE001
            errors[k] = e

    threads = [threading.Thread(target=node, args=(k,)) for k in range(len(locations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    return results


def test_a_bad_range_on_one_node_makes_every_node_fall_back(location, tmp_path, monkeypatch):
    """Node 0 finds a bad block in its own rank's file that node 1 does not read: node 1 alone would
    accept step 11, but every node falls back to step 10 and says which file and range was bad."""
    _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch)
    store = open_store(location)
    _corrupt(store, committed_key(store, 11, "__0_0.distcp"), BLOCK + 5)  # block 1: node 1 reads only block 3
    results = _restore_on_nodes(tmp_path, [location] * 2, lambda k: {"wanted": Wanted(node_ranks(k, 2, 2), 2)})
    assert results[0].step == results[1].step == 10
    for k in range(2):
        why = results[k].skipped[0][1]
        assert "__0_0.distcp: bytes 8192-16384 (block 1) fail their checksum" in why
        assert not (tmp_path / f"node{k}" / "step-11").exists()
    assert "node 0:" in results[1].skipped[0][1]


def test_an_acceptance_is_a_name_so_that_one_listing_decides(tmp_path):
    with HeldFolder(tmp_path / "v") as verdicts, ThreadPoolExecutor(3) as pool:
        agrees = [NodeAgreement(verdicts, k, 3, timeout_s=30, poll_s=0.01) for k in range(3)]
        assert list(pool.map(lambda agree: agree(7, ""), agrees)) == ["", "", ""]
    assert sorted(os.listdir(tmp_path / "v" / "step-7")) == ["node-0.ok", "node-1.ok", "node-2.ok"]  # none to read


def test_a_node_that_gives_no_verdict_ends_the_restore_everywhere(tmp_path):
    with HeldFolder(tmp_path / "verdicts") as verdicts:
        agree = NodeAgreement(verdicts, 0, 2, timeout_s=0.5, poll_s=0.05)
        with pytest.raises(StorageError, match=r"node\(s\) \[1\] gave no verdict on checkpoint step 5"):
            agree(5, "")
        NodeAgreement(verdicts, 1, 2).abort(6, "the store is unreachable")
        with pytest.raises(StorageError, match="node 1 could not restore checkpoint step 6: the store is unreachable"):
            agree(6, "")


def test_a_node_that_cannot_restore_at_all_tells_the_others_at_once(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    _commit(location, tmp_path / "local", [12], monkeypatch=monkeypatch)
    (tmp_path / "dest").write_text("a file where the destination folder goes")  # the disk side fails
    with HeldFolder(tmp_path / "v") as verdicts:
        with pytest.raises(OSError):
            restore_checkpoint(open_store(location), str(tmp_path / "dest"), wanted=Wanted([0], 2),
                               agree=NodeAgreement(verdicts, 0, 2, timeout_s=30))
        verdict = json.loads((tmp_path / "v" / "step-12" / "node-0.json").read_text())  # a rejection holds its reason
        assert verdict["fatal"] and not verdict["ok"]
        with pytest.raises(StorageError, match="node 0 could not restore checkpoint step 12"):
            NodeAgreement(verdicts, 1, 2, timeout_s=30)(12, "")


def test_cli_restores_one_nodes_share(tmp_path, monkeypatch, capsys):
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    assert ckpt_main(["ckpt", "restore", location, "--to", str(tmp_path / "n1"), "--node", "1", "--nodes", "2",
                      "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "the share of ranks 1:" in out
    assert (tmp_path / "n1" / "step-10" / "__1_0.distcp").read_bytes() == files["__1_0.distcp"]
    assert ckpt_main(["ckpt", "restore", location, "--to", str(tmp_path / "r"), "--ranks", "0,1", "--quiet"]) == 0
    assert all((tmp_path / "r" / "step-10" / p).read_bytes() == d for p, d in files.items())
    assert ckpt_main(["ckpt", "restore", location, "--to", str(tmp_path / "all"), "--quiet"]) == 0
    assert not (tmp_path / "all" / "step-10" / layout.META_DIR / "share.json").exists()
    for bad, why in ((["--node", "1"], "--node K needs --nodes N"), (["--ranks", "0", "--node", "0", "--nodes", "2"],
                     "not both"), (["--ranks", "x"], "expected ranks"), (["--node", "2", "--nodes", "2"], "node 2"),
                     (["--ranks", "5"], "rank 5 is not one of the 2 ranks")):
        assert ckpt_main(["ckpt", "restore", location, "--to", str(tmp_path / "b"), "--quiet", *bad]) != 0
        err = capsys.readouterr().err.strip()
        assert why in err and len(err.splitlines()) == 1, err


def test_verify_of_a_restored_share_checks_what_it_holds(tmp_path, monkeypatch, capsys):
    location = str(tmp_path / "remote")
    _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)
    folder = tmp_path / "n1"
    assert ckpt_main(["ckpt", "restore", location, "--to", str(folder), "--node", "1", "--nodes", "2",
                      "--quiet"]) == 0
    capsys.readouterr()
    assert ckpt_main(["ckpt", "verify", str(folder), "--quiet"]) == 0  # the files outside the share are not missing
    assert "OK" in (out := capsys.readouterr().out) and "(the share of ranks 1)" in out, out
    share = Share.from_json((folder / "step-10" / layout.META_DIR / SHARE_FILE).read_bytes(), "share.json")
    path, off = next((f.path, share.pieces(f)[0][0]) for f in read_manifest(open_store(str(folder)), 10).files
                     if f.path not in share.whole and share.pieces(f))
    with open(folder / "step-10" / path, "r+b") as f:  # one byte of a piece another rank's file lends rank 1
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert ckpt_main(["ckpt", "verify", str(folder), "--quiet"]) == 5
    out = capsys.readouterr().out
    assert f"{path}: bytes {off}-" in out and "fail their checksum" in out, out


def test_file_entry_round_trip_keeps_blocks():
    e = FileEntry("__0_0.distcp", 2 * BLOCK + 1, "c", BLOCK, ("a", "b", "c"))
    assert FileEntry.from_dict(e.to_dict(), "t") == e
    assert list(e.covering_blocks(BLOCK - 1, 2)) == [0, 1] and list(e.covering_blocks(2 * BLOCK, 1)) == [2]
    assert "block_size" not in FileEntry("x", 1, "c").to_dict()


def test_a_folder_shared_by_two_nodes_ends_up_with_both_shares(tmp_path, monkeypatch):
    """checkpoint.local on a shared filesystem: the second node's restore must not take away the
    blocks the first node's ranks read."""
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10], world=4, monkeypatch=monkeypatch)[10]
    store = open_store(location)
    first = restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([0, 1], 4))
    second = restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([2, 3], 4))
    assert first.share.ranks == [0, 1] and second.share.ranks == [0, 1, 2, 3]
    assert all((tmp_path / "shared" / "step-10" / p).read_bytes() == d for p, d in files.items())
    assert restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([1], 4)).reused


def test_small_items_other_ranks_read_are_fetched_exactly(location, tmp_path, monkeypatch):
    files = _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch, spans=True)
    store = open_store(location)
    entry = next(f for f in read_manifest(store, 10).files if f.path == "__0_0.distcp")
    data = files[10]["__0_0.distcp"]
    assert entry.spans == ((*ITEM, hash_bytes(data[ITEM[0]:sum(ITEM)], "xxh3_128")),)
    res = restore_checkpoint(store, str(tmp_path / "node1"), step=10, wanted=Wanted([1], 2))
    assert res.share.blocks == {} and res.share.spans == {"__0_0.distcp": [ITEM]}
    assert res.fetched == len(files[10][".metadata"]) + len(files[10]["__1_0.distcp"]) + ITEM[1]
    partial = (tmp_path / "node1" / "step-10" / "__0_0.distcp").read_bytes()
    assert partial[ITEM[0]:sum(ITEM)] == data[ITEM[0]:sum(ITEM)] and partial.count(0) >= len(data) - ITEM[1]


def test_the_committer_gathers_the_small_items_and_a_node_fetches_them_in_one_get(location, tmp_path, monkeypatch,
                                                                                  caplog):
    files = _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch, spans=True)
    store = open_store(location)
    m = read_manifest(store, 11)
    gathered = layout.spans_path(11, m.gathered.name)
    assert store.cat(gathered) == files[11]["__0_0.distcp"][ITEM[0]:sum(ITEM)]  # every file's spans, in order
    _corrupt(store, committed_key(store, 11, "__0_0.distcp"), ITEM[0] + 3)  # the item in its file: gathered serves
    with caplog.at_level("INFO", logger="slurm_titan.ckpt.restore"):
        res = restore_checkpoint(store, str(tmp_path / "node1"), wanted=Wanted([1], 2))
    assert res.step == 11 and "1 small item(s) of 1 file(s) in one GET" in caplog.text
    partial = (tmp_path / "node1" / "step-11" / "__0_0.distcp").read_bytes()
    assert partial[ITEM[0]:sum(ITEM)] == files[11]["__0_0.distcp"][ITEM[0]:sum(ITEM)]
    assert [p for p, _ in verify(store, 11).bad] == ["__0_0.distcp"]  # the file itself is still found bad
    _corrupt(store, gathered, 3)  # both copies bad: the step is refused, the restore falls back
    res = restore_checkpoint(store, str(tmp_path / "node1b"), wanted=Wanted([1], 2))
    assert res.step == 10 and f"__0_0.distcp: bytes {ITEM[0]}-{sum(ITEM)} fail their checksum" in res.skipped[0][1]
    assert "gathered small items damaged" in dict(verify(store, 11).bad)[gathered.split("/", 1)[1]]


def test_a_span_that_differs_from_its_ranks_checksum_keeps_the_step_incomplete(tmp_path):
    store = open_store(str(tmp_path / "remote"), create=True)
    store.put_bytes("step-3/__0_0.distcp", b"x" * 100)
    entry = FileEntry("__0_0.distcp", 100, hash_bytes(b"x" * 100), spans=((10, 8, hash_bytes(b"y" * 8)),))
    with pytest.raises(StorageError, match=r"__0_0.distcp: bytes 10-18 differ from what their rank recorded; "
                                           r"step 3 stays incomplete"):
        gather_spans(store, 3, "", [entry], "xxh3_128", lambda what, fn: fn())
    assert store.find("step-3/.slurm-titan") == []  # nothing written


# what ranks 2 and 3 of a new world size of 4 read of a checkpoint saved by 2 ranks: parts of rank 1's file
NEW_READS = {2: [("__1_0.distcp", 0, 2 * BLOCK)], 3: [("__1_0.distcp", 2 * BLOCK + 5, 10)]}


class _Planner:
    """The node's new ranks, as RankGroup.plan answers for them: what they read, noting each candidate's
    .metadata as the restore handed it over."""

    def __init__(self, reads=NEW_READS):
        self.reads, self.seen = reads, []

    def __call__(self, folder):
        assert ".planning-" in folder and "step-" not in os.path.basename(folder)
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            self.seen.append(f.read())
        return self.reads


def test_another_world_size_fetches_what_the_new_ranks_plan_against_each_candidate(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch)
    store = open_store(location)
    _corrupt(store, committed_key(store, 11, "__1_0.distcp"), BLOCK + 5)  # in a block the new ranks read: a fallback
    planner = _Planner()
    res = restore_checkpoint(store, str(tmp_path / "node1"), wanted=Wanted([2, 3], 4, planner))
    assert res.step == 10 and "__1_0.distcp: bytes 8192-16384 (block 1) fail their checksum" in res.skipped[0][1]
    assert planner.seen == [files[11][".metadata"], files[10][".metadata"]]  # planned again, against step 10
    assert (res.share.ranks, res.share.world_size) == ([2, 3], 4)
    assert res.share.whole == [".metadata"] and res.share.blocks == {"__1_0.distcp": [0, 1, 2]}
    assert res.fetched == len(files[10][".metadata"]) + 3 * BLOCK < read_manifest(store, 10).total_bytes
    partial = (tmp_path / "node1" / "step-10" / "__1_0.distcp").read_bytes()
    assert partial[:3 * BLOCK] == files[10]["__1_0.distcp"][:3 * BLOCK] and partial[3 * BLOCK:].count(0) == len(
        partial) - 3 * BLOCK
    assert not (tmp_path / "node1" / "step-10" / "__0_0.distcp").exists()
    assert not [n for n in os.listdir(tmp_path / "node1") if n.startswith(".planning-")]
    held = json.loads((tmp_path / "node1" / "step-10" / layout.META_DIR / SHARE_FILE).read_bytes())
    assert (held["ranks"], held["world_size"]) == ([2, 3], 4)


def test_a_corrupt_metadata_is_refused_before_any_rank_plans_against_it(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10, 11], monkeypatch=monkeypatch)
    store = open_store(location)
    _corrupt(store, committed_key(store, 11, ".metadata"), 3)
    planner = _Planner()
    res = restore_checkpoint(store, str(tmp_path / "node1"), wanted=Wanted([2, 3], 4, planner))
    assert res.step == 10 and ".metadata: bytes 0-" in res.skipped[0][1] and "fail their checksum" in res.skipped[0][1]
    assert planner.seen == [files[10][".metadata"]]


def test_when_one_node_cannot_verify_the_metadata_no_node_plans_against_it(tmp_path, monkeypatch):
    """Planning runs collectives across the nodes (torchtitan's fused-QKV state-dict hook gathers): node 1 sees a
    bad .metadata of step 11 (its own copy of the location), node 0 a good one, and neither node's ranks plan
    step 11; both fall back to step 10 and plan that."""
    good = str(tmp_path / "remote")
    files = _commit(good, tmp_path / "local", [10, 11], monkeypatch=monkeypatch)
    shutil.copytree(good, tmp_path / "remote-seen-by-node-1")
    bad = open_store(str(tmp_path / "remote-seen-by-node-1"))
    _corrupt(bad, committed_key(bad, 11, ".metadata"), 3)
    planners = {0: _Planner(), 1: _Planner()}
    results = _restore_on_nodes(tmp_path, [good, bad.location],
                                lambda k: {"wanted": Wanted([2 * k, 2 * k + 1], 4, planners[k])})
    assert results[0].step == results[1].step == 10
    assert planners[0].seen == planners[1].seen == [files[10][".metadata"]]  # step 11: no node's ranks planned
    assert "node 1:" in results[0].skipped[0][1] and ".metadata" in results[0].skipped[0][1]


def test_ranks_that_cannot_tell_what_they_read_get_the_whole_checkpoint(tmp_path, monkeypatch):
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    res = restore_checkpoint(open_store(location), str(tmp_path / "n"), wanted=Wanted([2, 3], 4, _Planner(None)))
    assert res.share is None and res.fetched == sum(map(len, files.values()))


def test_a_share_of_another_world_size_is_replaced_and_one_of_the_same_joined(tmp_path, monkeypatch):
    """checkpoint.local on a shared filesystem: a share left by the old world size serves no rank that
    loads now; the share another node of the new world size restored there does."""
    location = str(tmp_path / "remote")
    files = _commit(location, tmp_path / "local", [10], monkeypatch=monkeypatch)[10]
    store = open_store(location)
    old = restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([1], 2))
    assert old.share.whole == [".metadata", "__1_0.distcp"]  # holds all the new ranks 2, 3 read, of world size 2
    second = restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([2, 3], 4, _Planner()))
    assert not second.reused and (second.share.ranks, second.share.world_size) == ([2, 3], 4)
    assert second.share.blocks == {"__1_0.distcp": [0, 1, 2]}
    first = {0: [("__0_0.distcp", 0, SIZE)], 1: [("__0_0.distcp", 0, 10)]}
    both = restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([0, 1], 4, _Planner(first)))
    assert (both.share.ranks, both.share.world_size) == ([0, 1, 2, 3], 4)
    assert both.share.whole == [".metadata", "__0_0.distcp"] and both.share.blocks == {"__1_0.distcp": [0, 1, 2]}
    folder = tmp_path / "shared" / "step-10"
    assert (folder / "__0_0.distcp").read_bytes() == files["__0_0.distcp"]
    assert (folder / "__1_0.distcp").read_bytes()[:3 * BLOCK] == files["__1_0.distcp"][:3 * BLOCK]
    assert restore_checkpoint(store, str(tmp_path / "shared"), wanted=Wanted([2, 3], 4, _Planner())).reused
