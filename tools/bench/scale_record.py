#!/usr/bin/env python3
"""Benchmark: the commit record of llama3 70B with AdamW at N ranks (slurm-titan issue 24).

    .venv/bin/python -m tools.bench.scale_record                           # N = 64 ... 2048, a local folder
    .venv/bin/python -m tools.bench.scale_record --ranks 64 256 --s3-at 256  # one point against SeaweedFS too
    .venv/bin/python -m tools.bench.scale_record --code /path/to/older/checkout --spans all   # the code before

Synthetic receipts of the real model: 723 parameters (80 layers of wq, wk, wv, wo, w1, w2, w3 and two norms;
embeddings, output, final norm), each saved as weight and two AdamW moments (fp32, sharded over all N ranks on
dim 0: 2,169 items per rank, 847 GB in all), plus 725 replicated 8-byte items (AdamW's step per parameter and
train state) that DCP's dedup spreads over the ranks' files, at the head of each. Every rank reads its own file
whole and the replicated items of every other file (so its read map has min(N, 725) ranges of others' files).
Its receipt is the real Receipt of the code under test, written by its real ``commit.write_receipt``, its files
``__R_0.distcp``, with block checksums per 16 MiB and span checksums: of every item under a block (``--spans all``:
what the code before format 2 asked the saving rank for) or of the replicated items only (``replicated``: since).

The files: sparse, at their real sizes, in a local folder; against SeaweedFS (``--s3-at``) real but scaled down
4,096 times (4 KiB blocks: the same block and item counts, so the same record). Each measurement is a fresh
child process: the commit (the real ``commit.commit``: N receipts read, sizes checked against one listing, the
record written create-only) and one node's restore-side work (the record read and the node's share of its 8 ranks
worked out, and one rank's parse of what the node hands it); CPU seconds (user + system) and peak RSS from
``resource.getrusage``. Printed: record bytes (the index and the largest part), the commit's CPU-s and RSS, the
node's and the rank's; a power law fitted over the largest three points, extrapolated to 4,096 and 16,384 ranks
(labelled "fitted"), and PASS/FAIL against the goals: a record <= 32 MiB at 4,096 ranks (or an index <= 32 MiB
with each process reading the index and its own parts only), a commit <= 30 CPU-s and <= 1 GiB RSS, and a
node's restore GETs <= its own ranges + 16: counted from its share (one GET per block or span it fetches, one
per 16 MiB range of a file fetched whole, one for the spans the committer gathered into one object), those of
its own ranks' files ("own") and of the others' ("other": the replicated items).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.bench.llama3_70b import BLOCK, RANKS_PER_NODE, MiB, file_name, heads, params, rank_files, reads
from tools.bench.scale_sim.goals import fit

REPO = Path(__file__).resolve().parents[2]
STEP = 1000
ATTEMPT = "bench"
"""The attempt that uploads and commits the step (its files in step-1000/attempt-bench/)."""
GOALS = {"record_mib": 32.0, "commit_cpu_s": 30.0, "commit_rss_mib": 1024.0, "other_gets": 16.0}


# ------------------------------------------------------------------------------ one child process
def _code() -> dict:
    """What the code under test offers (the record's format 2 or the one before)."""
    import importlib.util

    return {"parts": importlib.util.find_spec("slurm_titan.ckpt.parts") is not None}


def _hex(*key: int) -> str:
    return f"{hash(key) & (2**128 - 1):032x}"


def prepare(location: str, n: int, scale: int, spans: str) -> dict:
    """Write the N ranks' files (sparse locally; scaled-down real bytes in S3) and receipts."""
    from slurm_titan.ckpt import FileEntry, Receipt, layout, open_store
    from slurm_titan.ckpt.checksum import hash_bytes
    from slurm_titan.ckpt.commit import write_receipt

    store = open_store(location, create=True)
    block = BLOCK // scale
    items, sizes = rank_files(n, scale)
    replicated = heads(items)
    local = not location.startswith("s3://")
    for r in range(n):
        path = file_name(r)
        key = layout.data_key(STEP, layout.attempt_dir(ATTEMPT), path)
        if local:
            full = store.full(key)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.truncate(sizes[r])
        else:
            store.put_bytes(key, bytes(sizes[r]))
        chosen = [(o, length, hash_bytes(bytes(length), "xxh3_128")) for o, length, rep in items[r]
                  if length < block and (rep or spans == "all")]  # the files hold zeros: their real checksums
        entry = FileEntry(path, sizes[r], _hex(r), block, tuple(_hex(r, b, 1) for b in range(-(-sizes[r] // block))),
                          tuple(chosen))
        write_receipt(store, Receipt(STEP, r, n, ATTEMPT, [entry], "xxh3_128", reads=reads(n, r, replicated, sizes)))
    return {}


def _usage() -> tuple[float, float]:
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 1024


def commit(location: str, n: int) -> dict:
    import threading
    import time

    from slurm_titan.ckpt import commit as commit_mod
    from slurm_titan.ckpt import layout, open_store

    store = open_store(location)
    cpu0, rss0 = _usage()
    t0 = time.monotonic()
    m = commit_mod.commit(store, STEP, world_size=n, attempt=ATTEMPT, algorithm="xxh3_128", config_digest="",
                          saved_at="", committed_by="bench", retry=lambda what, fn: fn(), stop=threading.Event(),
                          poll_interval=0.1)
    wall = time.monotonic() - t0
    cpu1, rss1 = _usage()
    assert m is not None, "not committed"
    index = len(store.cat(layout.commit_path(STEP)))
    part = max((p.size for p in m.parts or []), default=0) if _code()["parts"] else 0
    return {"index_bytes": index, "part_bytes": part, "commit_cpu_s": cpu1 - cpu0, "commit_wall_s": wall,
            "commit_rss_mib": rss1, "base_rss_mib": rss0}


def node(location: str, n: int) -> dict:
    """Node 0's restore-side work on the record (its 8 ranks' share), and one rank's parse of what it hands over."""
    from slurm_titan.ckpt import Manifest, Share, TransferConfig, layout, open_store, read_manifest
    from slurm_titan.ckpt.share import node_share

    store = open_store(location)
    ranks = list(range(min(RANKS_PER_NODE, n)))
    where = store.url(layout.commit_path(STEP))
    cpu0, _ = _usage()
    m = read_manifest(store, STEP)
    if _code()["parts"]:
        from slurm_titan.ckpt.parts import rank_reads

        share = node_share(m, rank_reads(store, m, ranks), where)
        local_record = m.local_copy() if hasattr(m, "local_copy") else m.raw  # what restore writes (the code before)
    else:
        share = node_share(m, ranks, where)  # type: ignore[arg-type]  # the code before: the read map inline
        local_record = m.to_json()
    assert share is not None
    handed = share.to_json()
    cpu1, rss1 = _usage()
    own = {f"__{r}_0.distcp" for r in ranks}
    part = TransferConfig().part_size  # a file fetched whole comes in ranges of this size
    gathered = getattr(m, "gathered", None) is not None and bool(share.spans)  # the spans in one GET of it
    gets = {f.path: -(-f.size // part) if f.path in share.whole else
            len(share.pieces(f)) - gathered * len(share.spans.get(f.path, [])) for f in m.files}
    Share.from_json(handed, "rank")
    if not _code()["parts"]:  # the rank parsed the node's copy of the record too (dcp_plan.check_share)
        Manifest.from_json(local_record, "rank")
    cpu2, rss2 = _usage()
    return {"node_cpu_s": cpu1 - cpu0, "node_rss_mib": rss1, "rank_cpu_s": cpu2 - cpu1,
            "handed_bytes": len(handed) + len(local_record) * (not _code()["parts"]),
            "own_gets": sum(n for path, n in gets.items() if path in own),
            "other_gets": sum(n for path, n in gets.items() if path not in own) + gathered}


# ------------------------------------------------------------------------------ the parent
def _child(code: str, op: str, *args: object, env: dict | None = None) -> dict:
    """Run ``op`` in a fresh process whose slurm_titan is ``code``'s (this checkout's tools)."""
    cmd = [sys.executable, "-m", "tools.bench.scale_record", "--child", code, op, *map(str, args)]
    out = subprocess.run(cmd, env=dict(os.environ, **(env or {})), cwd=REPO, check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(code: str, location: str, n: int, scale: int, spans: str, env: dict | None = None) -> dict:
    _child(code, "prepare", location, n, scale, spans, env=env)
    row = {"ranks": n, **_child(code, "commit", location, n, env=env), **_child(code, "node", location, n, env=env)}
    row["record_mib"] = (row["index_bytes"] + row["part_bytes"]) / MiB
    return row


COLUMNS = [("ranks", "ranks", 6, "{}"), ("record_mib", "record MiB", 10, "{:.2f}"),
           ("index_bytes", "index B", 10, "{}"),
           ("part_bytes", "part B", 8, "{}"), ("commit_cpu_s", "commit CPU-s", 12, "{:.2f}"),
           ("commit_wall_s", "wall s", 7, "{:.2f}"), ("commit_rss_mib", "RSS MiB", 8, "{:.0f}"),
           ("node_cpu_s", "node CPU-s", 10, "{:.3f}"), ("node_rss_mib", "RSS MiB", 8, "{:.0f}"),
           ("rank_cpu_s", "rank CPU-s", 10, "{:.4f}"), ("handed_bytes", "handed B", 11, "{}"),
           ("own_gets", "own GETs", 9, "{}"), ("other_gets", "other GETs", 10, "{}")]


def table(rows: list[dict]) -> None:
    print(" ".join(label.rjust(w) for _, label, w, _ in COLUMNS))
    for r in rows:
        print(" ".join(f.format(r[k]).rjust(w) for k, _, w, f in COLUMNS))


def report(rows: list[dict], label: str) -> bool:
    print(f"\n{label}")
    table(rows)
    ok = True
    for at in (4096, 16384):
        measured = next((r for r in rows if r["ranks"] == at), None)
        if measured is None and len(rows) < 2:
            print(f"{at:>6} ranks: too few points to fit (give --ranks two or more)")
            ok = False
            continue
        got = {k: (measured[k] if measured else fit(rows, k, at)) for k in GOALS}
        how = "measured" if measured else "fitted"
        extra = {k: (measured[k] if measured else fit(rows, k, at)) for k in ("node_cpu_s", "node_rss_mib")}
        print(f"{at:>6} ranks ({how}): record {got['record_mib']:.1f} MiB, commit {got['commit_cpu_s']:.1f} CPU-s, "
              f"{got['commit_rss_mib']:.0f} MiB RSS; a node {extra['node_cpu_s']:.2f} CPU-s, "
              f"{extra['node_rss_mib']:.0f} MiB RSS")
        if at == 4096:
            for k, limit in GOALS.items():
                passed = got[k] <= limit
                ok &= passed
                print(f"  {'PASS' if passed else 'FAIL'}  {k} {got[k]:.1f} <= {limit:g} at 4,096 ranks ({how})")
    return ok


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, sys.argv[2])  # before any slurm_titan import: the code under test
        op, rest = sys.argv[3], sys.argv[4:]
        fn = {"prepare": lambda: prepare(rest[0], int(rest[1]), int(rest[2]), rest[3]),
              "commit": lambda: commit(rest[0], int(rest[1])), "node": lambda: node(rest[0], int(rest[1]))}[op]
        print(json.dumps(fn()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    ap.add_argument("--code", default=str(REPO), help="the checkout whose slurm_titan is measured")
    ap.add_argument("--spans", choices=["all", "replicated"], default=None,
                    help="which items the saving ranks checksum on their own (default: as the code does)")
    ap.add_argument("--s3-at", type=int, nargs="*", default=[], help="also measure these N against SeaweedFS")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    code = str(Path(args.code).resolve())
    spans = args.spans or ("replicated" if (Path(code) / "slurm_titan/ckpt/parts.py").exists() else "all")
    print(f"code: {code} (spans: {spans}); llama3 70B + AdamW, {len(params())} parameters, "
          f"{3 * 4 * sum(params()) / 1e9:.0f} GB, {RANKS_PER_NODE} ranks a node")
    rows, s3_rows = [], []
    for n in sorted(args.ranks):
        with tempfile.TemporaryDirectory(prefix="scale-record-") as tmp:
            rows.append(measure(code, str(Path(tmp) / "remote"), n, 1, spans))
        print(f"  {n} ranks: {json.dumps({k: round(v, 3) for k, v in rows[-1].items()})}", flush=True)
    ok = report(rows, "local folder (sparse files at their real sizes)")
    if args.s3_at:
        sys.path.insert(0, str(REPO))
        from tests.support.s3 import S3Server

        with S3Server() as srv:
            for n in sorted(args.s3_at):
                s3_rows.append(measure(code, srv.fresh_url(), n, 4096, spans, env=srv.env()))
        print("\nSeaweedFS (files scaled down 4,096 times: the same blocks and items)")
        table(s3_rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"code": code, "spans": spans, "local": rows, "s3": s3_rows}, indent=1))
    print("\nPASS" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
