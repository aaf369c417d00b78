"""tools/bench/scale_record.py's configuration at 16 ranks, as a correctness test: the real receipts of llama3
70B with AdamW (2,169 sharded items and the replicated ones a rank), committed by the real commit; the record's
index stays O(files + ranks), each rank's read map is in its own part, and a node's share comes from the index
and its own ranks' parts."""

from __future__ import annotations

import json

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import read_manifest
from slurm_titan.ckpt.manifest import INDEX_MAX_BYTES
from slurm_titan.ckpt.parts import all_reads, rank_reads
from slurm_titan.ckpt.share import node_share
from slurm_titan.ckpt.storage import open_store
from tools.bench import scale_record as bench
from tools.bench.llama3_70b import BLOCK, RANKS_PER_NODE, REPLICATED, rank_files

N = 16


def test_the_record_of_16_ranks_of_a_70b_model(location):
    scale = 1 if "://" not in location else 4096  # S3: the files scaled down, the same blocks and items
    bench.prepare(location, N, scale, "replicated")
    row = bench.commit(location, N)
    store = open_store(location)
    m = read_manifest(store, bench.STEP)
    index = store.cat(layout.commit_path(bench.STEP))
    assert row["index_bytes"] == len(index) < INDEX_MAX_BYTES and b" " not in index
    items, sizes = rank_files(N, scale)
    blocks = sum(-(-s // (BLOCK // scale)) for s in sizes)
    assert sum(len(f.blocks) for f in m.files) == blocks and len(index) < 40 * blocks + 400 * N
    # the items other ranks read have their own checksums, and only they: not the 2,169 shards of each rank
    assert sum(len(f.spans) for f in m.files) == REPLICATED
    receipts = [store.cat(layout.receipt_path(bench.STEP, r, bench.ATTEMPT)) for r in range(N)]
    assert not any(json.loads(receipt).get("reads") for receipt in receipts)
    reads = all_reads(store, m)
    heads = {r: sum(n for o, n, rep in items[r] if rep) for r in range(N)}
    for r in range(N):
        assert reads[r][0] == ("__0_0.distcp", 0, heads[0] if r else sizes[0])
        assert (f"__{r}_0.distcp", 0, sizes[r]) in reads[r] and len(reads[r]) == N
    ranks = list(range(RANKS_PER_NODE))
    share = node_share(m, rank_reads(store, m, ranks), "t")
    assert share.whole == sorted(f"__{r}_0.distcp" for r in ranks)
    assert share.spans == {f"__{k}_0.distcp": [(o, n) for o, n, rep in items[k] if rep] for k in range(8, N)}
    assert not share.blocks and share.nbytes(m) == sum(sizes[:8]) + sum(heads[k] for k in range(8, N))
    node = bench.node(location, N)
    assert node["handed_bytes"] == len(share.to_json())
