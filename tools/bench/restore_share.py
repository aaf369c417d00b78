#!/usr/bin/env python3
"""Benchmark: each node restores its share of a real DCP checkpoint, against today's whole download.

    .venv/bin/python -m tools.bench.restore_share                      # 4 and 8 ranks, 32 MiB per rank
    .venv/bin/python -m tools.bench.restore_share --ranks 4 --mib-per-rank 16 --s3

A real ``dcp.save`` on the CPU (one gloo process per rank) of a state shaped like torchtitan's:
FSDP-sharded parameters and two Adam moments (DTensors, Shard(0)), replicated tensors and train
state (deduplicated into one rank's file at save), a per-rank data loader position. Each rank's
read map comes from DCP's load planner (slurm_titan.rank.dcp_plan), the checkpoint is committed
to a directory (or, with --s3, a private SeaweedFS on loopback), then every node of N restores
(1 and 2 ranks per node): its share, and the whole checkpoint as today, alternately. Reported:
bytes fetched per node / (checkpoint / N) (goal <= 1.1), the seconds of both restores per node,
and the egress projected to the 70B config on 8 and 64 nodes with the arithmetic shown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def rank_main(local: str, remote: str, mib: int) -> int:
    """One saving rank (RANK, WORLD_SIZE, MASTER_* set)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from slurm_titan.ckpt import CheckpointSync
    from slurm_titan.ckpt.storage import TransferConfig
    from slurm_titan.rank.dcp_plan import load_reads, small_items

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    rows = mib * MiB // 4 // 3 // 1024 // 4  # 4 weights x (param + 2 moments) of [rows*world, 1024] fp32
    g = torch.Generator().manual_seed(0)
    sd: dict = {"model": {}, "optimizer": {}}
    for i in range(4):  # FSDP2 shards every parameter and both AdamW moments (Shard(0))
        for name, shape in ((f"layers.{i}.w", (rows * world, 1024)), (f"layers.{i}.norm", (1024 * world,))):
            for kind, out in (("", sd["model"]), ("exp_avg.", sd["optimizer"]), ("exp_avg_sq.", sd["optimizer"])):
                out[kind + name] = distribute_tensor(torch.randn(*shape, generator=g), mesh, [Shard(0)])
            sd["optimizer"][f"step.{name}"] = torch.tensor(1000.0)  # AdamW's step: a plain tensor, replicated
    sd["train_state"] = {"step": 1000, "ntokens_seen": 123456789}
    sd["lr_scheduler"] = {"last_epoch": 1000, "base_lrs": [3e-4]}
    sd["dataloader"] = {f"dp_rank_{rank}": torch.full((4096,), float(rank))}
    md = dcp.save(sd, checkpoint_id=os.path.join(local, "step-1000"))
    reads = load_reads(sd, md)
    sync = CheckpointSync(remote, local, rank=rank, world_size=world, attempt="bench", poll_interval=0.05)
    sync.submit(1000, reads, small_items(md, rank, TransferConfig.from_env().block_size))
    ok = sync.close(timeout=600)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def save(world: int, local: Path, remote: str, mib: int, env: dict) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-m", "tools.bench.restore_share", "--rank-of", str(local), remote,
                               str(mib)], env=dict(base, RANK=str(r)), cwd=REPO) for r in range(world)]
    if any(p.wait() for p in procs):
        raise RuntimeError("a saving rank failed")


def bench(world: int, args, work: Path, remote: str, results: dict) -> None:
    from slurm_titan.ckpt import Wanted, node_ranks, open_store, read_manifest, restore_checkpoint

    t = time.perf_counter()
    save(world, work / f"save-{world}", remote, args.mib_per_rank, dict(os.environ))
    saved_s = time.perf_counter() - t
    store = open_store(remote)
    m = read_manifest(store, 1000)
    total = m.total_bytes
    for per in sorted({1, 2} & set(range(1, world + 1))):
        nodes = world // per
        rows = []
        for k in range(nodes):
            ranks = node_ranks(k, nodes, world)
            times: dict[str, list[float]] = {"share": [], "whole": []}
            fetched = 0
            for rnd in range(args.rounds):
                for kind in (("share", "whole") if rnd % 2 == 0 else ("whole", "share")):
                    dest = work / f"n{k}-{kind}"
                    shutil.rmtree(dest, ignore_errors=True)
                    t = time.perf_counter()
                    res = restore_checkpoint(store, str(dest), step=1000,
                                             wanted=Wanted(ranks if kind == "share" else None, world))
                    times[kind].append(time.perf_counter() - t)
                    if kind == "share":
                        fetched, share = res.fetched, res.share
                    shutil.rmtree(dest, ignore_errors=True)
            own = sum(f.size for f in m.files if f.path in {f"__{r}_0.distcp" for r in ranks} | {".metadata"})
            rows.append({"node": k, "ranks": ranks, "fetched_bytes": fetched, "other_files_bytes": fetched - own,
                         "other_blocks": sum(len(b) for b in share.blocks.values()),
                         "fetched_over_fair_share": round(fetched / (total / nodes), 3),
                         "share_s": round(statistics.median(times["share"]), 3),
                         "whole_s": round(statistics.median(times["whole"]), 3)})
        worst = max(r["fetched_over_fair_share"] for r in rows)
        egress_share = sum(r["fetched_bytes"] for r in rows)
        key = f"{world} ranks on {nodes} nodes"
        results[key] = {"checkpoint_bytes": total, "files": len(m.files), "nodes": rows,
                        "worst_fetched_over_fair_share": worst, "egress_shares": egress_share,
                        "egress_today": nodes * total,
                        "egress_ratio_today_over_shares": round(nodes * total / egress_share, 2),
                        "save_s": round(saved_s, 1)}
        print(f"{key}: checkpoint {total / MiB:.0f} MiB; per node fetched / (checkpoint / N): "
              + ", ".join(f"{r['fetched_over_fair_share']:.3f}" for r in rows)
              + " (goal <= 1.1); restore s per node, share vs whole: "
              + ", ".join(f"{r['share_s']:.2f}/{r['whole_s']:.2f}" for r in rows)
              + f"; egress {egress_share / MiB:.0f} MiB vs today {nodes * total / MiB:.0f} MiB", flush=True)


def projection(results: dict) -> list[str]:
    """The 70B config (checkpoint ~280 GB, 8 nodes, ~35 GB of it each node's own): egress per restore."""
    ratio = max(v["worst_fetched_over_fair_share"] for v in results.values() if isinstance(v, dict))
    lines = []
    c = 280.0
    for n in (8, 64):
        today = n * c
        shares = n * (c / n) * ratio
        lines.append(f"70B, {n} nodes: today {n} x {c:.0f} GB = {today:,.0f} GB; shares <= {n} x ({c:.0f} GB / {n}) "
                     f"x {ratio:.3f} = {shares:,.0f} GB ({today / shares:.1f}x less), each node <= "
                     f"{c / n * ratio:.1f} GB instead of {c:.0f} GB")
    lines.append("(beyond its own files a node fetches the items its ranks read of other files: the small ones "
                 "(train state, AdamW step counters) exactly, larger ones as the 16 MiB blocks covering them; at 70B "
                 "that is KiBs per file against 35 GB (8 nodes) or 4.4 GB (64 nodes) of a node's own files)")
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-of":
        return rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, action="append", help="saving world sizes (default 4 and 8)")
    ap.add_argument("--mib-per-rank", type=int, default=32)
    ap.add_argument("--block-kb", type=int, default=16384, help="block checksum size (default 16384 KiB, the store's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="a private SeaweedFS on loopback instead of a directory")
    ap.add_argument("--work-dir", default="/var/tmp/slurm-titan-bench-share")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    os.environ["SLURM_TITAN_CKPT_BLOCK_KB"] = str(args.block_kb)
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict = {"block_kib": args.block_kb, "mib_per_rank": args.mib_per_rank}
    try:
        worlds = args.ranks or [4, 8]
        if args.s3:
            from tests.support.s3 import S3Server

            with S3Server(bucket="slurm-titan-bench", data_dir=str(work / "seaweedfs")) as srv:
                os.environ.update(srv.env())
                for w in worlds:
                    bench(w, args, work, srv.url(f"share-{w}"), results)
        else:
            for w in worlds:
                bench(w, args, work, str(work / f"remote-{w}"), results)
        results["projection_70B"] = projection(results)
        for line in results["projection_70B"]:
            print(line)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
