"""Each node restores its share of a real DCP checkpoint: saved by 2 and 4 ranks (gloo on the CPU,
one process per rank), its read map worked out by DCP's planner on each saving rank, restored per
node as sparse files with verified blocks; a load from a node's share gives the same tensors as a
load from the whole checkpoint, and the bytes fetched are each node's share only. On another world
size the new ranks (a gated RankGroup per node) plan their load at the restore gate, and each node
fetches what they read: what their dcp.load then reads."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import read_manifest
from slurm_titan.ckpt.fetch_plan import Wanted
from slurm_titan.ckpt.parts import all_reads, rank_reads
from slurm_titan.ckpt.restore import restore_checkpoint
from slurm_titan.ckpt.share import SHARE_FILE, Share, node_ranks, node_share, reads_share
from slurm_titan.ckpt.storage import TransferConfig, open_store
from slurm_titan.node.spec import CheckpointPlan
from slurm_titan.node.supervisor import restore as node_restore
from slurm_titan.node.supervisor.rendezvous import Rendezvous
from slurm_titan.node.supervisor.supervisor import RankGroup
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.restore_verdict import RestoreVerdict
from tests.support import dcp_share_worker
from tests.support.paths import repo_pythonpath

WORKER = [sys.executable, "-m", "tests.support.dcp_share_worker"]  # as the node supervisor starts a rank
BLOCK = 4096
FORK_SERVER = multiprocessing.get_context("forkserver")
FORK_SERVER.set_forkserver_preload(["tests.support.dcp_share_worker"])  # torch imported once, not per rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forked_ranks(op: str, world: int, args, tmp: Path) -> list[tuple[int | None, str]]:
    """Run the worker's ``op`` on ``world`` ranks, each a process of its own forked from the fork server;
    ``args(rank)`` -> (local, remote, out): each rank's (exit code, output)."""
    port = _free_port()
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
               SLURM_TITAN_CKPT_BLOCK_KB=str(BLOCK // 1024), OMP_NUM_THREADS="1")
    procs, logs = [], []
    tmp.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        logs.append(tmp / f"{op}-{r}.log")
        argv = [op, *(str(a) for a in args(r))]
        procs.append(FORK_SERVER.Process(target=dcp_share_worker.forked, args=(argv, dict(env, RANK=str(r)),
                                                                               str(logs[-1]))))
        procs[-1].start()
    for p in procs:
        p.join(300)
        if p.exitcode is None:
            p.kill()
            p.join()
    return [(p.exitcode, log.read_text(errors="replace")) for p, log in zip(procs, logs)]


def _ranks(op: str, world: int, args, tmp: Path) -> list[dict]:
    """Run the worker's ``op`` on ``world`` ranks; ``args(rank)`` -> (local, remote): what each wrote."""
    outs = [tmp / f"{op}-{r}.json" for r in range(world)]
    done = _forked_ranks(op, world, lambda r: (*args(r), outs[r]), tmp)
    for r, (code, log) in enumerate(done):
        assert code == 0, f"rank {r} failed:\n{log[-3000:]}"
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture(scope="module", params=[2, 4])
def saved(request, tmp_path_factory):
    """A DCP checkpoint of step 1 saved by `world` ranks and committed to a directory store."""
    world = request.param
    tmp = tmp_path_factory.mktemp(f"dcp{world}")
    remote, local = tmp / "remote", tmp / "local"
    results = _ranks("save", world, lambda r: (local, remote), tmp)
    assert all(r["ok"] for r in results)
    return world, tmp, remote, results


def test_read_map_comes_from_each_ranks_plan(saved):
    world, _tmp, remote, results = saved
    store = open_store(str(remote))
    m = read_manifest(store, 1)
    read_map = all_reads(store, m)
    assert read_map == [[tuple(r) for r in res["reads"]] for res in results]
    assert all(f.block_size == BLOCK and len(f.blocks) == -(-f.size // BLOCK) for f in m.files)
    for rank, reads in enumerate(read_map):
        own = f"__{rank}_0.distcp"
        size = next(f.size for f in m.files if f.path == own)
        assert (own, 0, size) in reads  # a rank reads all it wrote (its shards, its data loader position)
    # the replicated items (saved once, in one rank's file) are read by every rank: some rank reads
    # part of a file it did not write
    assert any(p != f"__{rank}_0.distcp" for rank, reads in enumerate(read_map) for p, _, _ in reads)
    # and only items other ranks read have their own checksums (a shard is read by its own rank only): the
    # record's index stays O(files), and each rank's reads are in its own part
    by_others = [(p, o, n) for rank, reads in enumerate(read_map) for p, o, n in reads if p != f"__{rank}_0.distcp"]
    spans = [(f.path, o, n) for f in m.files for o, n, _ in f.spans]
    assert spans and all(any(p == q and a <= o and o + n <= a + k for q, a, k in by_others) for p, o, n in spans)
    assert m.parts is not None and len(m.parts) == world


@pytest.mark.parametrize("nodes", [1, 2])
def test_each_node_fetches_its_share_and_loads_what_the_whole_checkpoint_holds(saved, nodes, caplog):
    world, tmp, remote, _ = saved
    if world % nodes or world // nodes < 1:
        pytest.skip("ranks do not split over the nodes")
    store = open_store(str(remote), transfer=TransferConfig(block_size=BLOCK))
    m = read_manifest(store, 1)
    whole = restore_checkpoint(store, str(tmp / f"whole-{nodes}"), step=1)
    assert whole.fetched == m.total_bytes and whole.share is None
    sizes = {f.path: f.size for f in m.files}
    node_dirs = {}
    fetched = []
    for k in range(nodes):
        ranks = node_ranks(k, nodes, world)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="slurm_titan.ckpt.restore"):
            res = restore_checkpoint(store, str(tmp / f"n{nodes}-node{k}"), wanted=Wanted(ranks, world))
        node_dirs[k] = Path(res.path)
        line = next(r.getMessage() for r in caplog.records if "fetched" in r.getMessage())
        got = int(re.search(r"fetched (\d+) of (\d+) bytes", line).group(1))
        assert got == res.fetched == node_share(m, rank_reads(store, m, ranks), "t").nbytes(m)
        own = sum(sizes[f"__{r}_0.distcp"] for r in ranks) + sizes[".metadata"]
        assert own <= got  # its own ranks' files, whole, and the metadata
        # plus, of other ranks' files, only the blocks covering what its ranks read
        # plus, of other ranks' files, exactly the items under a block its ranks read (their own
        # checksums) and the blocks covering larger ones
        assert got - own <= sum(len(res.share.blocks.get(p, [])) * BLOCK + sum(n for _, n in res.share.spans.get(p, []))
                                for p in sizes)
        if nodes > 1:
            assert got < m.total_bytes
        if res.share.spans:  # the small items of other ranks' files: from the committer's gathered object
            assert m.gathered is not None and "file(s) in one GET" in line, line
        fetched.append(got)
        for r in range(world):  # files of other nodes' ranks: sparse (holes where nothing was fetched), or absent
            p = node_dirs[k] / f"__{r}_0.distcp"
            held = p.name in res.share.whole or p.name in res.share.blocks or p.name in res.share.spans
            assert (p.stat().st_size == sizes[p.name]) if held else not p.exists()
    if nodes > 1:
        assert sum(fetched) < nodes * m.total_bytes
        assert max(fetched) / (m.total_bytes / nodes) <= 2.0  # a tiny checkpoint: 4 KiB blocks weigh
    per_node = world // nodes
    loaded = _ranks("load", world, lambda r: (node_dirs[r // per_node], Path(whole.path)), tmp)
    for r, got in enumerate(loaded):
        assert got["share"] == got["whole"] == got["saved"], f"rank {r}"


def test_a_rank_whose_load_reads_outside_its_nodes_share_is_refused(saved):
    """A node that restored the share of ranks 0.. but runs a rank whose plan reads elsewhere (another
    node's ranks): the check before dcp.load refuses, instead of loading holes as zeros."""
    world, tmp, remote, _ = saved
    store = open_store(str(remote), transfer=TransferConfig(block_size=BLOCK))
    res = restore_checkpoint(store, str(tmp / "wrong"), wanted=Wanted([0], world))
    # every rank loads from rank 0's share: ranks 1.. find their own shards missing
    done = _forked_ranks("load", world, lambda r: (res.path, res.path, tmp / f"wrong-{r}.json"), tmp / "wrong")
    code, bad = done[1]  # rank 0 may pass its own check and then fail in the load's collectives
    assert code != 0 and "__1_0.distcp" in bad and "did not fetch" in bad and "refusing to load" in bad
    assert layout.META_DIR in os.listdir(res.path)


FETCHED = re.compile(r"this node's share \(ranks (\d+)-(\d+)\) fetched: (\d+) of (\d+) bytes")


@pytest.mark.parametrize(("new_world", "nodes"), [(1, 1), (2, 2), (4, 2)])
def test_another_world_size_each_node_fetches_what_its_new_ranks_dcp_load_reads(saved, new_world, nodes, tmp_path):
    world, _tmp, remote, _ = saved
    if new_world == world:
        pytest.skip("the world size that saved it")
    store = open_store(str(remote), transfer=TransferConfig(block_size=BLOCK))
    m = read_manifest(store, 1)
    whole = restore_checkpoint(store, str(tmp_path / "whole"), step=1)
    per = new_world // nodes
    port = _free_port()
    env = dict(repo_pythonpath(), SAVED_WORLD=str(world), OMP_NUM_THREADS="1")
    plan = CheckpointPlan(local="", remote=str(remote))
    out = tmp_path / "out"
    out.mkdir()
    said: dict[int, list[str]] = {k: [] for k in range(nodes)}
    groups, verdicts, errors = {}, {}, {}
    for k in range(nodes):
        rdzv = Rendezvous("127.0.0.1", port, node_rank=k, num_nodes=nodes, procs_per_node=per,
                          hosts=tuple(f"n{i}" for i in range(nodes)))
        argv = [*WORKER, "reshard", str(tmp_path / f"node{k}" / "step-1"), whole.path, str(out)]
        groups[k] = RankGroup(argv, env, rdzv, tmp_path / "job", gated=True)

    def node(k: int) -> None:
        def restore_node() -> RestoreVerdict:
            with HeldFolder(tmp_path / "verdicts") as folder:
                verdicts[k] = node_restore.restore(plan, str(tmp_path / f"node{k}"), "job", new_world,
                                                   said[k].append, ranks=node_ranks(k, nodes, new_world), node=k,
                                                   nodes=nodes, verdicts=folder, planner=groups[k].plan)
            return verdicts[k]
        try:
            groups[k].release_after(restore_node)
        except Exception as e:  # noqa: BLE001
            errors[k] = e

    threads = [threading.Thread(target=node, args=(k,)) for k in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    codes = {r: c for g in groups.values() for r, c in g.wait().items()}
    logs = {r: run_folder.rank_log(tmp_path / "job", r).read_text() for r in codes}
    assert set(codes.values()) == {0}, {r: logs[r][-3000:] for r, c in codes.items() if c}
    for k in range(nodes):
        assert verdicts[k] == RestoreVerdict(world_size_changed=True)
        text = "\n".join(said[k])
        assert f"saved by {world} ranks on {new_world} ranks: model and optimizer are resharded by DCP" in text
        line = FETCHED.search(text)
        assert line, text
        ranks = node_ranks(k, nodes, new_world)
        got, total = int(line.group(3)), int(line.group(4))
        assert (int(line.group(1)), int(line.group(2))) == (ranks[0], ranks[-1]) and total == m.total_bytes
        share = Share.from_json((tmp_path / f"node{k}" / "step-1" / layout.META_DIR / SHARE_FILE).read_bytes(), "t")
        assert (share.ranks, share.world_size) == (ranks, new_world)
        results = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in ranks}
        planned = {r: [tuple(x) for x in res["planned"][0]] for r, res in results.items()}
        assert all(len(res["planned"]) == 1 for res in results.values())  # one candidate, planned once
        assert share == reads_share(m, planned, new_world, "t") and got == share.nbytes(m)
        if nodes > 1:
            assert got < m.total_bytes
        for r, res in results.items():
            assert [tuple(x) for x in res["read"]] == planned[r], f"rank {r}"  # what dcp.load read: the plan
            assert all(share.covers(*x) for x in planned[r])
            assert res["share"] == res["whole"] == res["saved"], f"rank {r}"  # no hole was loaded as zeros


def test_a_replicated_tensor_saved_as_shards_is_read_in_part_by_each_rank_and_loads_either_way(tmp_path: Path) -> None:
    results = _ranks("replicated", 2, lambda r: (tmp_path / "old", tmp_path / "new"), tmp_path)
    for r, res in enumerate(results):
        old, new = res["old"], res["new"]
        assert (old["chunks"], new["chunks"]) == (1, 2)  # DCP keeps one copy; sharded, each rank's rows
        assert old["equal"] and new["equal"], f"rank {r}"  # either checkpoint loads into the replicated tensor
        assert new["placements"] == ["S(0)"]
        assert new["read"] < 0.6 * old["read"], res  # each rank reads its half, not the whole tensor
