#!/usr/bin/env python3
"""Benchmark: the CPU one RAM-tier snapshot's copy to the partner node costs (issue 25).

    .venv/bin/python -m tools.bench.ram_push [--mb 38] [--pushes 10] [--json out.json]

Every `checkpoint.memory.interval` steps each node supervisor pushes its ranks' sealed snapshots to its partner's
snapshot server (slurm_titan.ram.transfer.push: each file's digest, then the file over HTTP; the receiver checks
the digest as it writes). Both ends run in this process here (the pusher and the server's threads, over loopback,
into /dev/shm), so its CPU time (user + system) is the two nodes' together. Measured in one run:

- push: the project's `transfer.push` as it is (XXH3-64 digests, the file sent in `transfer.CHUNK` blocks);
- reference: the same push with zlib's CRC-32 as the digest (what the push used before 2026-12-07; before
  2026-12-06 it also sent in http.client's default 8 KiB blocks: 0.69x that, docs/measurements.md).

On a node whose host cores are busy with training (2 shared cores here) this CPU is taken from the ranks; the
ratio push / reference is the figure that travels across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_titan.ram import layout, snapshot, transfer


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Crc32:
    """zlib's CRC-32 as a running digest (the reference)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


@contextmanager
def _crc32_digests() -> Iterator[None]:
    """Both ends of a push digest with CRC-32 instead of XXH3-64."""
    original, transfer.new_digest = transfer.new_digest, Crc32  # type: ignore[assignment]
    try:
        yield
    finally:
        transfer.new_digest = original  # type: ignore[assignment]


def _sealed_snapshot(root: Path, megabytes: int) -> Path:
    """A rank's sealed snapshot of step 4 in `root`: one shard file of `megabytes` MB and a small .metadata."""
    staging = layout.step_dir(root, 4) / ".rank-1.bench"
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(os.urandom(megabytes * 10**6))
    (staging / ".metadata").write_bytes(os.urandom(140_000))
    manifest = snapshot.Manifest.of_folder(staging, run="bench", step=4, rank=1, world_size=2)
    final = layout.rank_dir(root, 4, 1)
    snapshot.seal(staging, manifest, final)
    return final


def _pushes(folder: Path, receiver: Path, server: transfer.SnapshotServer, count: int) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(count):
        shutil.rmtree(layout.step_dir(receiver, 4), ignore_errors=True)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        transfer.push(folder, "127.0.0.1", server.port, server.token)
        cpu.append(_cpu_s() - cpu0)
        wall.append(time.perf_counter() - wall0)
    return {"cpu_s": round(statistics.median(cpu), 4), "wall_s": round(statistics.median(wall), 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=38, help="snapshot size in MB (38: a debug-model rank's)")
    parser.add_argument("--pushes", type=int, default=10, help="pushes of each kind; medians are reported")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ram-push-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        folder, receiver = _sealed_snapshot(scratch / "sender", args.mb), scratch / "receiver"
        server = transfer.SnapshotServer(receiver, "bench", 2).start()
        push = _pushes(folder, receiver, server, args.pushes)
        with _crc32_digests():
            reference = _pushes(folder, receiver, server, args.pushes)
        server.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {"mb": args.mb, "pushes": args.pushes, "push": push, "reference_crc32": reference,
               "cpu_ratio": round(push["cpu_s"] / reference["cpu_s"], 3)}
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
