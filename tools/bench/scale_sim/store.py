"""The store part of the scale harness: save, commit, restore, list and prune of llama3 70B with AdamW at N
simulated ranks, through the throttling S3 proxy in front of SeaweedFS.

    .venv/bin/python -m tools.bench.scale_sim --parts store --ranks 64 128

Every node has its own proxy (:mod:`tools.local_s3.throttle_proxy`, in this process), all of them sharing one
throttle (the store's budget), so that each request is counted against the node that made it. A rank is the real
:class:`~slurm_titan.ckpt.upload.CheckpointSync` (uploader; rank 0 commits) over its own file, scaled down 4,096
times (the same blocks and items as the real one: :mod:`tools.bench.llama3_70b`), uploaded in as many parts as the
real one (:data:`PART_SIZE`, :func:`_scaled`), its requests paced at its share of ``checkpoint.upload_rate``: the
store sees the real requests at their real pace and a 4,096th of the bytes. Each rank has the spans and reads its
checkpointer would give; ranks are threads of a few worker processes
(``python -m tools.bench.scale_sim.store``). A node is the real :func:`~slurm_titan.ckpt.restore.prepare_resume`
of its 8 ranks' share on a fresh disk, a file fetched in as many ranges as at full size (:func:`_scaled_restores`),
with the real :class:`~slurm_titan.ckpt.agree.NodeAgreement` over a local job folder. The phases, each against fresh
counters:

- ``save``: step 1000 saved and committed, nothing throttled (the reference times);
- ``throttled save``: step 2000, over receipts an earlier attempt left for it (every rank's), with 50 % of the
  requests answered 503 SlowDown (Retry-After 1) for the save's first 10 s; the retries' waves, and beside them the
  first tries' (requests the pace spaces evenly: where they reach the store in waves too, the harness's processes,
  not the code, decided when requests left), and every request's (``save_all_peak_ratio``: first tries and retries
  together, the busiest 100 ms over their mean per 100 ms over the 10 s, the issue's words read as they stand);
- ``restore``: every node restores the newest complete step, unthrottled, then again on fresh disks with the
  store's budget (a token bucket per prefix) at half the request rate the unthrottled restore made, for 60 s;
- ``refused``: one node restores while the store refuses every GET of a data file, with a retry budget
  (SLURM_TITAN_STORE_RETRY_S) of 4 s: the error must name the object and the store's answer;
- ``list`` and ``prune`` (keep the newest): their requests.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from tools.bench.llama3_70b import RANKS_PER_NODE, file_name, heads, rank_files, reads
from tools.bench.scale_sim.goals import Goal
from tools.local_s3 import seaweed
from tools.local_s3.throttle_proxy import Config, Request, Server, Throttle, Zeros

if TYPE_CHECKING:
    from slurm_titan.ckpt.storage import TransferConfig

SCALE = 4096
"""The files' sizes are divided by this (their blocks, items and upload parts are not)."""
PART_SIZE = (16 << 20) // SCALE
"""The upload's part, scaled down with the files: a scaled file goes up in as many parts as the real one takes at
16 MiB (about 50,000 a save, at any N): S3's requests as they are, its bytes scaled down."""
STEPS = (1000, 2000)
STALE_ATTEMPT = "sim-0"
"""The earlier attempt that left a receipt of every rank for step 2000 (the throttled save is attempt sim-2's)."""
THROTTLED_S = 10.0
BUDGET_S = 60.0
PER_WORKER = {"save": 128, "stale": 128, "restore": 8}
"""Ranks (nodes, for a restore) a worker process runs, as threads."""
BIN_S = 0.1
AROUND_S = 0.5
"""A wave is a 100 ms bin against the mean of this long either side of it (:func:`_wave_ratio`)."""

GOALS = (
    Goal("restore: GETs a node makes beyond its own ranks' files", "restore_extra_gets", 16, kind="every"),
    Goal("restore at 2x the store's budget: share of the nodes that restored", "budget_restored", 1, kind="every",
         most=False),
    Goal("a store refusing beyond the retry budget: the error names the object and the answer", "refusal_named", 1,
         kind="every", most=False),
    Goal("save at 50% SlowDown: bytes sent / bytes needed", "save_bytes_ratio", 1.1, kind="every"),
    Goal("save at 50% SlowDown: busiest 100 ms of retries / their mean over the second around it",
         "save_wave_ratio", 2.0, kind="largest"),
    Goal("save at 50% SlowDown: busiest 100 ms of every request / their mean over the 10 s", "save_all_peak_ratio",
         2.0, kind="largest"),
    Goal("commit at 50% SlowDown / unthrottled", "commit_ratio", 2.0, kind="every"),
    # a receipt is read once, or twice when rewritten between the listing and the read; not once a poll
    Goal("commit: receipt GETs per rank", "receipt_gets_per_rank", 3.0, kind="every"),
    # an earlier attempt's receipts for the same step are in its own folder: the commit never lists or reads them
    # (before fenced attempts every one of them was read at every poll)
    Goal("commit beside an earlier attempt's receipts: requests into its folder", "stale_requests", 0,
         kind="every"),
)


# ------------------------------------------------------------------------------ the parent
class Proxies:
    """One throttling proxy a node, sharing one throttle, every request kept; with ``discard``, the files' zeros
    kept as their sizes, not in the store (:class:`~tools.local_s3.throttle_proxy.Zeros`)."""

    def __init__(self, store: seaweed.Server, nodes: int, discard: bool = False) -> None:
        host, port = store.endpoint.removeprefix("http://").split(":")
        self.throttle = Throttle(Config(), seed=0)

        def assemble(path: str, body: bytes) -> tuple[int, bytes]:  # parts under 5 MiB: the proxy keeps them
            return store.request("PUT", path, body=body, timeout=120)

        zeros = Zeros() if discard else None
        self.servers = [Server(0, (host, int(port)), self.throttle, keep_requests=True, assemble=assemble,
                               discard=zeros) for _ in range(nodes)]
        for s in self.servers:
            threading.Thread(target=s.serve_forever, name="proxy", daemon=True).start()

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self.servers]

    def configure(self, **changes: Any) -> None:
        self.throttle.set(Config().updated(changes, "scale_sim"))

    def reset(self) -> None:
        for s in self.servers:
            s.counters.reset()

    def requests(self) -> list[list[Request]]:
        """Per node, its requests since the last reset."""
        return [list(s.counters.requests) for s in self.servers]

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


@contextmanager
def store_and_proxies(workdir: Path, nodes: int, discard: bool = False) -> Iterator[tuple[seaweed.Server, Proxies]]:
    server = seaweed.Server(port=seaweed.free_port(), data_dir=str(workdir / "seaweed"), bucket="scale")
    server.start(die_with_parent=True)
    proxies = Proxies(server, nodes, discard)
    try:
        yield server, proxies
    finally:
        proxies.close()
        server.stop()


def _workers(op: str, task: dict[str, Any], units: list[int], env: dict[str, str],
             on_start: Callable[[], None] | None = None) -> tuple[float, list[dict]]:
    """Run ``op`` for ``units`` (ranks or nodes) split over worker processes, every unit starting at once when
    all are ready (then ``on_start`` is called); the start (``time.monotonic()``) and their results."""
    procs = []
    for i in range(0, len(units), PER_WORKER[op]):
        msg = json.dumps(dict(task, units=units[i:i + PER_WORKER[op]]))
        procs.append(subprocess.Popen([sys.executable, "-m", "tools.bench.scale_sim.store", op, msg], text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, **env)))
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n", f"a {op} worker did not start"
    start = time.monotonic()
    if on_start is not None:
        on_start()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out: list[dict[str, Any]] = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode:
            raise RuntimeError(f"a {op} worker failed (exit {p.returncode})")
        out += json.loads(stdout.strip().splitlines()[-1])
    return start, out


def _stale_dir() -> str:
    """The folder of the earlier attempt's objects (its receipts): ``attempt-sim-0``."""
    from slurm_titan.ckpt.layout import attempt_dir  # here: the parent sets the store's environment first

    return attempt_dir(STALE_ATTEMPT)


def _is_receipt(r: Request) -> bool:
    return "/.slurm-titan/receipts/" in r.path


def _is_receipt_listing(r: Request) -> bool:
    return r.method == "GET" and "list-type" in r.path and "receipts" in r.path and r.status == 200


def _request_key(r: Request) -> tuple[str, str, str, str]:
    """Who asks (a rank's store names it in its User-Agent, :func:`_rank`) and what: its method, object and part
    (``partNumber``; a listing: its whole query), not the signature of its presigned URL. A rank's first request
    for an object that another rank was refused (every rank checks the one commit record) is a first try."""
    path, _, query = r.path.partition("?")
    if "list-type" in query:
        return r.client, r.method, path, query
    return r.client, r.method, path, parse_qs(query).get("partNumber", [""])[0]


def _tries(requests: list[Request]) -> tuple[list[float], list[float]]:
    """When each first try and each retry came (sorted): a retry is a request whose previous one asking for the same
    (:func:`_request_key`) was refused (503)."""
    refused: set[tuple[str, str, str, str]] = set()
    first: list[float] = []
    retries: list[float] = []
    for r in sorted(requests, key=lambda r: r.at):
        key = _request_key(r)
        (retries if key in refused else first).append(r.at)
        (refused.add if r.status == 503 else refused.discard)(key)
    return first, retries


def _bins(times: list[float], end: float) -> list[int]:
    """``times`` (sorted, all before ``end``) counted in bins of 100 ms from the first."""
    bins = [0] * (int((end - times[0]) / BIN_S) + 1)
    for t in times:
        bins[int((t - times[0]) / BIN_S)] += 1
    return bins


def _peak_ratio(times: list[float], end: float) -> float:
    """The busiest 100 ms of ``times`` (up to ``end``) over their mean per 100 ms. Of the retries: the first
    requests of all ranks leave together by design (DCP's save ends on every rank at once), and on this
    machine their pace is its CPUs'; waves of retries that came back together are what must not be."""
    times = [t for t in times if t < end]
    if not times:
        return 0.0
    bins = _bins(times, end)
    return max(bins) / (len(times) / len(bins))


def _wave_ratio(times: list[float], end: float) -> float:
    """The busiest 100 ms of ``times`` (up to ``end``) over the mean of the second around it (within the span):
    a wave, not a rate that changes over the seconds. The rate of retries climbs through a throttled save as
    each node's request limit, halved by the refusals, grows back (AIMD), so the busiest 100 ms of the save's
    last seconds stand above the whole span's mean without any two retries having come back together."""
    times = [t for t in times if t < end]
    if not times:
        return 0.0
    bins, k = _bins(times, end), round(AROUND_S / BIN_S)
    ratios = []
    for i, count in enumerate(bins):
        near = bins[max(0, i - k):i + k + 1]  # holds `count`: its sum is never 0 where count is not
        if count:
            ratios.append(count / (sum(near) / len(near)))
    return max(ratios)


def _chance(measure: Callable[[list[float], float], float], times: list[float], end: float,
            draws: int = 201) -> float:
    """``measure`` of as many times drawn uniformly at random over the same span, the median of ``draws`` draws:
    what chance alone gives with as many requests, no waves at all."""
    times = [t for t in times if t < end]
    if len(times) < 2:
        return 0.0
    draw = random.Random(0)
    ratios = sorted(measure(sorted(draw.uniform(times[0], end) for _ in times), end) for _ in range(draws))
    return ratios[draws // 2]


def _save(proxies: Proxies, task: dict[str, Any], ranks: int, step: int, env: dict[str, str],
          throttle_s: float = 0.0) -> dict[str, float]:
    """Save ``step`` on every rank, rank 0 committing; the figures of the phase."""
    proxies.reset()
    timer = threading.Timer(throttle_s, proxies.configure)

    def throttle() -> None:
        proxies.configure(share=0.5, retry_after=1)
        timer.start()

    start_at, results = _workers("save", dict(task, step=step), list(range(ranks)), env,
                                 on_start=throttle if throttle_s else None)
    timer.cancel()
    proxies.configure()
    bad = [r for r in results if r["error"]]
    if bad:
        raise RuntimeError(f"rank {bad[0]['unit']} did not save step {step}: {bad[0]['error']}")
    requests = [r for node in proxies.requests() for r in node]
    last_receipt = max(r.at for r in requests if _is_receipt(r) and r.method == "PUT" and r.status == 200)
    committed = next(r["done"] for r in results if r["unit"] == 0)
    sent = sum(r.bytes_in for r in requests if r.method in ("PUT", "POST"))
    needed = sum(r.bytes_in for r in requests if r.method in ("PUT", "POST") and r.status == 200)
    receipt_gets = sum(1 for r in requests
                       if _is_receipt(r) and r.method == "GET" and "list-type" not in r.path and r.status == 200)
    stale = _stale_dir()
    stale_requests = sum(1 for r in requests if stale in unquote(r.path))
    first, retries = _tries(requests) if throttle_s else ([], [])
    first = [t for t in first if t >= start_at]  # not the ranks' store checks as their workers started
    return {"save_s": committed - start_at, "commit_s": committed - last_receipt, "bytes_ratio": sent / needed,
            "peak_ratio": _peak_ratio(retries, end := start_at + throttle_s),
            "chance_peak_ratio": _chance(_peak_ratio, retries, end), "retries": float(len(retries)),
            "wave_ratio": _wave_ratio(retries, end), "chance_wave_ratio": _chance(_wave_ratio, retries, end),
            "first_wave_ratio": _wave_ratio(first, end), "chance_first_wave_ratio": _chance(_wave_ratio, first, end),
            "all_peak_ratio": _peak_ratio(every := sorted(first + retries), end),
            "chance_all_peak_ratio": _chance(_peak_ratio, every, end),
            "requests": len(requests), "throttled": sum(r.status == 503 for r in requests),
            "parts": sum(r.method == "PUT" and "partNumber=" in r.path and r.status == 200 for r in requests),
            "receipt_gets": receipt_gets, "receipt_polls": sum(map(_is_receipt_listing, requests)),
            "stale_requests": stale_requests}


def _restore(proxies: Proxies, task: dict[str, Any], nodes: int, tag: str, env: dict[str, str]) -> dict[str, Any]:
    proxies.reset()
    t0, results = _workers("restore", dict(task, tag=tag), list(range(nodes)), env)
    took = time.monotonic() - t0
    per_node = proxies.requests()
    times = sorted(r.at for reqs in per_node for r in reqs)
    extra = []
    for k, reqs in enumerate(per_node):
        own = {file_name(r) for r in range(k * RANKS_PER_NODE, (k + 1) * RANKS_PER_NODE)}
        gets = [r for r in reqs if r.method == "GET" and "list-type" not in r.path and r.status == 200]
        extra.append(sum(1 for r in gets if r.path.split("?", 1)[0].rsplit("/", 1)[-1] not in own))
    return {"took_s": took, "requests": len(times), "rate": len(times) / max(times[-1] - times[0], 1e-3),
            "extra_gets": max(extra),
            "ok": sum(1 for r in results if not r["error"]) / nodes,
            "errors": sorted({r["error"] for r in results if r["error"]})}


def _prepare_files(root: Path, ranks: int) -> None:
    """Each node's local checkpoint folder holds its ranks' files of both steps (sparse), node 0 the .metadata."""
    _, sizes = rank_files(ranks, SCALE)
    for step in STEPS:
        for r in range(ranks):
            folder = root / f"node-{r // RANKS_PER_NODE}" / f"step-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / file_name(r), "wb") as f:
                f.truncate(sizes[r])
        # DCP's .metadata: a chunk entry for each of a rank's 2,169 items on every rank, ~128 bytes each
        (root / "node-0" / f"step-{step}" / ".metadata").write_bytes(bytes(2169 * ranks * 128 // SCALE))


def measure(ranks: int, workdir: Path, throttled_s: float = THROTTLED_S, part_size: int = PART_SIZE,
            upload_rate: float | None = None, discard: bool = False) -> dict[str, float]:
    """One row: the figures of every phase at ``ranks`` simulated ranks (8 a node) in ``workdir`` (emptied first);
    the save is throttled for ``throttled_s`` seconds, its files cut into parts of ``part_size`` bytes, the ranks'
    uploads paced at an even share of ``upload_rate`` requests a second (None: ``checkpoint.upload_rate``'s
    default; 0: unpaced); with ``discard`` the store holds none of the files' bytes (the proxies answer for their
    zeros: :class:`Proxies`)."""
    if upload_rate is None:
        from slurm_titan.node.spec import CheckpointSpec

        upload_rate = CheckpointSpec().upload_rate
    nodes = ranks // RANKS_PER_NODE
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    _prepare_files(workdir / "local", ranks)
    with store_and_proxies(workdir, nodes, discard) as (server, proxies):
        env = {k: v for k, v in server.env().items() if k != "AWS_ENDPOINT_URL"}
        task = {"url": f"s3://{server.bucket}/run", "endpoints": proxies.endpoints, "ranks": ranks, "nodes": nodes,
                "workdir": str(workdir), "part_size": part_size, "upload_rate": upload_rate}
        plain = _save(proxies, dict(task, attempt="sim-1"), ranks, STEPS[0], env)
        _workers("stale", dict(task, step=STEPS[1], attempt=STALE_ATTEMPT), list(range(ranks)), env)
        throttled = _save(proxies, dict(task, attempt="sim-2"), ranks, STEPS[1], env, throttle_s=throttled_s)
        restore = _restore(proxies, task, nodes, "plain", env)
        proxies.configure(rate=restore["rate"] / 2, burst=10, retry_after=1)
        stop = threading.Timer(BUDGET_S, proxies.configure)
        stop.start()
        budget = _restore(proxies, task, nodes, "budget", env)
        stop.cancel()
        # GETs of data files, not a listing whose query names one (a page's start-after)
        proxies.configure(share=1.0, paths=r"^[^?]*\.distcp($|\?)", methods=["GET"])
        refused = _restore(proxies, dict(task, agree=False), 1, "refused",
                           dict(env, SLURM_TITAN_STORE_RETRY_S="4"))
        proxies.configure()
        listing = _list_and_prune(server, proxies, task)
        discarded = len(zeros.objects) if (zeros := proxies.servers[0].zeros) else 0
    error = refused["errors"][0] if refused["errors"] else ""
    if not ("SlowDown" in error and ".distcp" in error):
        print(f"  store at {ranks} ranks: the refused restore ended with {error or 'no error'!r}", file=sys.stderr)
    return {"ranks": float(ranks), "nodes": float(nodes), "upload_rate": upload_rate,
            "save_s": plain["save_s"], "commit_s": plain["commit_s"], "save_requests": plain["requests"],
            "save_parts": plain["parts"],
            "throttled_save_s": throttled["save_s"], "throttled_commit_s": throttled["commit_s"],
            "save_throttled": throttled["throttled"], "save_bytes_ratio": throttled["bytes_ratio"],
            "save_peak_ratio": throttled["peak_ratio"], "save_chance_peak_ratio": throttled["chance_peak_ratio"],
            "save_retries": throttled["retries"], "save_wave_ratio": throttled["wave_ratio"],
            "save_chance_wave_ratio": throttled["chance_wave_ratio"],
            "save_first_wave_ratio": throttled["first_wave_ratio"],
            "save_chance_first_wave_ratio": throttled["chance_first_wave_ratio"],
            "save_all_peak_ratio": throttled["all_peak_ratio"],
            "save_chance_all_peak_ratio": throttled["chance_all_peak_ratio"],
            "commit_ratio": throttled["commit_s"] / max(plain["commit_s"], 1e-3),
            "receipt_gets_per_rank": throttled["receipt_gets"] / ranks, "receipt_polls": throttled["receipt_polls"],
            "stale_requests": throttled["stale_requests"],
            "restore_s": restore["took_s"], "restore_requests": restore["requests"],
            "restore_extra_gets": restore["extra_gets"], "budget_restore_s": budget["took_s"],
            "budget_restored": budget["ok"],
            "refusal_named": float("SlowDown" in error and ".distcp" in error), **listing,
            "files_discarded": float(discarded)}


def _list_and_prune(server: seaweed.Server, proxies: Proxies, task: dict[str, Any]) -> dict[str, float]:
    os.environ.update({k: v for k, v in server.env().items() if k != "AWS_ENDPOINT_URL"})
    from slurm_titan.ckpt import list_checkpoints, open_store
    from slurm_titan.ckpt.retention import prune

    store = open_store(task["url"], endpoint_url=proxies.endpoints[0])
    proxies.reset()
    infos = list_checkpoints(store)
    listed = len(proxies.requests()[0])
    assert [i.step for i in infos if i.complete] == list(STEPS), infos
    proxies.reset()
    prune(store, keep_last=1, infos=infos)
    pruned = len(proxies.requests()[0])
    assert [i.step for i in list_checkpoints(store)] == [STEPS[1]], "prune kept the wrong steps"
    return {"list_requests": float(listed), "prune_requests": float(pruned)}


# ------------------------------------------------------------------------------ the workers
Action = Callable[[], dict[str, Any]]


def _scaled(part_size: int, upload_rate: float) -> TransferConfig:
    """What the ranks' uploads are cut into, scaled down with the files: the record's blocks (the same number a
    file as at full size), the body size from which a PUT waits for ``100 Continue``, and the parts
    (``part_size``: under S3's 5 MiB, which SeaweedFS refuses at an upload's completion, so the proxies keep the
    parts and write each file whole); the uploads paced at ``upload_rate`` requests a second, as a rank's uploader
    paces them (its share of ``checkpoint.upload_rate``: the requests are the real ones, not scaled)."""
    from slurm_titan.ckpt.storage import TransferConfig

    full = TransferConfig()
    return dataclasses.replace(full, block_size=full.block_size // SCALE, part_size=part_size,
                               min_part_size=part_size, expect_continue_min=full.expect_continue_min // SCALE,
                               upload_rate=upload_rate)


def _scaled_restores(part_size: int) -> None:
    """This worker's restores fetch a file in as many ranges as at full size, as its saves cut it into parts: the
    stores they open take the scaled transfer settings (:func:`_scaled`; a node's restore opens its own with
    ``TransferConfig.from_env``), and a file of two parts or more comes in ranges (at full size: 16 MiB or more)."""
    from slurm_titan.ckpt.storage import base, s3_http

    scaled = _scaled(part_size, 0.0)
    base.TransferConfig.from_env = classmethod(lambda cls: dataclasses.replace(scaled))  # type: ignore[method-assign]
    s3_http._RANGED_MIN = 2 * part_size


def _rank(task: dict[str, Any], r: int, items: list, sizes: list[int], replicated: list[int]) -> Action:
    """Rank ``r``'s uploader, opened (its store checked, as at a rank's start), and what its load reads (worked out
    before the start: on 2 cores, 512 ranks' own work at the save's start took 8 s, when the uploads barely ran and
    the throttle's 10 s were spent); the action saves the step."""
    from slurm_titan.ckpt import open_store
    from slurm_titan.ckpt.upload import CheckpointSync

    node = r // RANKS_PER_NODE
    store = open_store(task["url"], endpoint_url=task["endpoints"][node],
                       transfer=_scaled(task["part_size"], task["upload_rate"] / task["ranks"]),
                       storage_options={"config_kwargs": {"user_agent_extra": f"client/{r}"}})
    sync = CheckpointSync(store, str(Path(task["workdir"]) / "local" / f"node-{node}"), rank=r,
                          world_size=task["ranks"], attempt=task["attempt"], nice=0)
    spans = {file_name(r): [(o, n) for o, n, rep in items[r] if rep]}
    rank_reads = reads(task["ranks"], r, replicated, sizes)

    def save() -> dict[str, Any]:
        sync.submit(task["step"], reads=rank_reads, spans=spans)
        ok = sync.close()
        return {"unit": r, "done": time.monotonic(), "error": "" if ok else sync.status(task["step"])}

    return save


def _stale_receipt(task: dict[str, Any], r: int) -> dict[str, Any]:
    """The receipt an earlier attempt's rank ``r`` left for the step (its step 1000's receipt, renamed)."""
    from slurm_titan.ckpt import layout, open_store
    from slurm_titan.ckpt.commit import write_receipt
    from slurm_titan.ckpt.manifest import Receipt

    store = open_store(task["url"], endpoint_url=task["endpoints"][r // RANKS_PER_NODE], check=False)
    done = Receipt.from_json(store.cat(layout.receipt_path(STEPS[0], r, "sim-1")), where="step 1000")
    write_receipt(store, Receipt(task["step"], r, done.world_size, task["attempt"], done.files, done.algorithm))
    return {"unit": r, "error": ""}


def _node(task: dict[str, Any], k: int) -> dict[str, Any]:
    """Node ``k`` restores its ranks' share of the newest complete step on a fresh disk."""
    from slurm_titan.ckpt import NodeAgreement, Wanted, prepare_resume
    from slurm_titan.ckpt.share import node_ranks
    from slurm_titan.errors import StorageError
    from slurm_titan.records.held_folder import HeldFolder

    work = Path(task["workdir"])
    verdicts = HeldFolder(work / "job" / task["tag"])
    agree = NodeAgreement(verdicts, k, task["nodes"], timeout_s=600) if task.get("agree", True) else None
    try:
        prepare_resume(task["url"], str(work / "restored" / task["tag"] / f"node-{k}"),
                       wanted=Wanted(node_ranks(k, task["nodes"], task["ranks"]), task["ranks"]),
                       endpoint_url=task["endpoints"][k], agree=agree, notice=lambda _msg: None)
        return {"unit": k, "error": ""}
    except StorageError as e:
        return {"unit": k, "error": str(e)}
    except Exception as e:  # noqa: BLE001 - the harness's fault: said, not a restore that failed
        return {"unit": k, "error": f"harness: {type(e).__name__}: {e}"}
    finally:
        verdicts.close()


def _in_threads(fns: list[Callable[[], Any]]) -> list[Any]:
    out: list[Any] = [None] * len(fns)
    threads = [threading.Thread(target=lambda i=i, fn=fn: out.__setitem__(i, fn())) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _worker(op: str, task: dict[str, Any]) -> list[dict[str, Any]]:
    """Prepare every unit's action, say "ready", run them all at "go"."""
    units: list[int] = task["units"]
    actions: list[Action]
    if op == "save":
        items, sizes = rank_files(task["ranks"], SCALE)
        replicated = heads(items)
        actions = _in_threads([functools.partial(_rank, task, u, items, sizes, replicated) for u in units])
    else:
        if op == "restore":
            _scaled_restores(task["part_size"])
        one = {"stale": _stale_receipt, "restore": _node}[op]
        actions = [functools.partial(one, task, u) for u in units]
    print("ready", flush=True)
    sys.stdin.readline()
    return _in_threads(actions)


if __name__ == "__main__":
    import logging
    import resource

    logging.basicConfig(level=logging.ERROR)
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)  # a worker holds many ranks' (or nodes') files
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))
    print(json.dumps(_worker(sys.argv[1], json.loads(sys.argv[2]))))
