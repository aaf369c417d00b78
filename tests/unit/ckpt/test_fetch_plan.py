"""What a node wants, and the plan of one candidate's fetch: files whole, pieces of files, the spans that come
from the record's gathered object (and where in it), the bytes moved."""

from __future__ import annotations

import dataclasses

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.fetch_plan import FetchPlan, Wanted
from slurm_titan.ckpt.manifest import FileEntry, GatheredRef, Manifest
from slurm_titan.ckpt.share import reads_share

BLOCK = 100
ITEM = (10, 20)  # a small item of rank 0's file (its own checksum), after another one in the gathered object


def _file(path: str, size: int, spans: tuple = ()) -> FileEntry:
    return FileEntry(path, size, "c", BLOCK, tuple(f"b{i}" for i in range(-(-size // BLOCK))), spans)


M = Manifest(step=5, world_size=2, algorithm="xxh3_128",
             files=[_file(".metadata", 30), _file("__0_0.distcp", 450, ((0, 10, "s0"), (*ITEM, "s1"))),
                    _file("__1_0.distcp", 450)],
             gathered=GatheredRef(layout.spans_name("0123abcd"), 30, "g"))


def test_the_world_size_is_another_only_when_both_are_known_and_differ():
    assert Wanted([0], 4).resharded_to(2) == 4
    assert Wanted([0], 2).resharded_to(2) is None
    assert Wanted([0]).resharded_to(2) is None  # loaded by the saving world size
    assert Wanted([0], 4).resharded_to(None) is None  # a listing that does not say who saved it


def test_the_whole_checkpoint_is_every_file_whole():
    plan = FetchPlan.of(M, None)
    assert plan.whole == tuple(M.files) and plan.pieces == () and plan.gathered == ()
    assert (plan.step, plan.algorithm, plan.nbytes) == (5, "xxh3_128", M.total_bytes)
    assert plan.source("__1_0.distcp") == "step-5/__1_0.distcp"


def test_a_share_is_its_files_whole_its_pieces_and_its_items_from_the_gathered_object():
    share = reads_share(M, {2: [("__0_0.distcp", *ITEM), ("__1_0.distcp", 0, 225)]}, 4, "t")
    plan = FetchPlan.of(M, share)
    assert [f.path for f in plan.whole] == [".metadata"]
    assert [(f.path, pieces) for f, pieces in plan.pieces] == [
        ("__0_0.distcp", ((*ITEM, "s1"),)), ("__1_0.distcp", ((0, BLOCK, "b0"), (BLOCK, BLOCK, "b1"),
                                                               (2 * BLOCK, BLOCK, "b2")))]
    assert plan.gathered == (("__0_0.distcp", *ITEM, 10),)  # after the 10 bytes of the item before it
    assert plan.nbytes == share.nbytes(M) == 30 + ITEM[1] + 3 * BLOCK
    assert FetchPlan.of(dataclasses.replace(M, gathered=None), share).gathered == ()  # each item from its file
