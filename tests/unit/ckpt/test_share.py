"""A node's share from its ranks' reads: the read map's (same world size) and the new ranks' own (another
world size) go through one function; shares of one world size join; share.json says whose share it is."""

from __future__ import annotations

import json

import pytest

from slurm_titan.ckpt.manifest import FORMAT_1, FileEntry, Manifest, ManifestError
from slurm_titan.ckpt.share import Share, node_share, reads_share

BLOCK = 100
ITEM = (0, 10)  # a small item at the head of rank 0's file that every rank reads (its own checksum)


def _file(path: str, size: int, spans: tuple = ()) -> FileEntry:
    return FileEntry(path, size, "c", BLOCK, tuple(f"b{i}" for i in range(-(-size // BLOCK))), spans)


M = Manifest(step=5, world_size=2, algorithm="xxh3_128",
             files=[_file(".metadata", 30), _file("__0_0.distcp", 450, ((*ITEM, "s"),)), _file("__1_0.distcp", 450)],
             read_map=[[("__0_0.distcp", 0, 450)], [("__0_0.distcp", *ITEM), ("__1_0.distcp", 0, 450)]],
             format=FORMAT_1)


def _node(ranks: list[int]) -> Share | None:
    """The share of saving ranks, from M's read map (what .parts.rank_reads gives a node)."""
    return node_share(M, {r: M.read_map[r] for r in ranks}, "t")

# four new ranks, each reading a quarter of the model: ranks 0, 1 in rank 0's old file, ranks 2, 3 in rank 1's
NEW = {0: [("__0_0.distcp", *ITEM), ("__0_0.distcp", 10, 215)],
       1: [("__0_0.distcp", *ITEM), ("__0_0.distcp", 225, 225)],
       2: [("__0_0.distcp", *ITEM), ("__1_0.distcp", 0, 225)], 3: [("__0_0.distcp", *ITEM), ("__1_0.distcp", 225, 225)]}


def test_the_read_maps_share_is_the_share_of_its_reads():
    share = _node([1])
    assert share == reads_share(M, {1: M.read_map[1]}, 2, "t")
    assert (share.ranks, share.world_size, share.whole, share.blocks, share.spans) == (
        [1], 2, [".metadata", "__1_0.distcp"], {}, {"__0_0.distcp": [ITEM]})


def test_new_ranks_of_another_world_size_get_the_blocks_and_items_they_read():
    first = reads_share(M, {0: NEW[0]}, 4, "t")
    assert (first.ranks, first.world_size) == ([0], 4)
    assert first.whole == [".metadata"] and first.blocks == {"__0_0.distcp": [0, 1, 2]} and not first.spans
    third = reads_share(M, {2: NEW[2]}, 4, "t")
    assert third.blocks == {"__1_0.distcp": [0, 1, 2]} and third.spans == {"__0_0.distcp": [ITEM]}
    assert third.nbytes(M) == 30 + 3 * BLOCK + ITEM[1]
    both = reads_share(M, {0: NEW[0], 1: NEW[1]}, 4, "t")
    assert both.ranks == [0, 1] and both.whole == [".metadata", "__0_0.distcp"]  # all its blocks: whole


def test_shares_of_one_world_size_join_into_the_share_of_all_their_ranks():
    one = {r: reads_share(M, {r: NEW[r]}, 4, "t") for r in NEW}
    for a, b in ((0, 1), (0, 2), (2, 3), (1, 3)):
        assert one[a].joined(one[b], M) == reads_share(M, {a: NEW[a], b: NEW[b]}, 4, "t")
    assert _node([0]).joined(_node([1]), M) == _node([0, 1])
    assert node_share(M, None, "t") is None  # a record without read maps: all of it


def test_a_read_of_a_file_missing_from_the_record_names_the_rank():
    with pytest.raises(ManifestError, match="t: rank 3 reads bytes 0-5 of __7_0.distcp, a file missing"):
        reads_share(M, {3: [("__7_0.distcp", 0, 5)]}, 4, "t")


def test_share_json_says_whose_share_it_is():
    share = reads_share(M, {2: NEW[2], 3: NEW[3]}, 4, "t")
    assert Share.from_json(share.to_json(), "t") == share
    old = json.loads(share.to_json())
    del old["world_size"]  # written before shares of another world size: the saving one's
    assert Share.from_json(json.dumps(old).encode(), "t").world_size is None


def test_share_json_alone_tells_what_is_held():
    """A rank checks its load against share.json, without the commit record: the share records the size and
    block size of each file held in part (older share records do not: filled in from the record)."""
    share = reads_share(M, {2: NEW[2]}, 4, "t")
    assert share.files == {"__1_0.distcp": (450, BLOCK), "__0_0.distcp": (450, BLOCK)}
    back = Share.from_json(share.to_json(), "t")
    assert back.covers("__1_0.distcp", 0, 300) and back.covers("__0_0.distcp", *ITEM) and back.covers(".metadata", 0, 5)
    assert not back.covers("__1_0.distcp", 250, 60) and not back.covers("__0_0.distcp", 0, 11)
    assert not back.covers("__1_0.distcp", 440, 20)  # outside the file
    old = json.loads(share.to_json())
    del old["files"]
    before = Share.from_json(json.dumps(old).encode(), "t")
    assert not before.covers("__1_0.distcp", 0, 10) and before.with_files(M) == share
