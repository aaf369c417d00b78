#!/usr/bin/env python3
"""Benchmark: how much an upload running beside it slows a training loop, thread vs process.

    .venv/bin/python -m tools.bench.upload_interference [--rounds 3] [--steps 15] [--shard-mib 36]

A small PyTorch model trains on CPU 0 (one thread, Python launching every operator as
torchtitan does) while checkpoints of --shard-mib are uploaded over and over to a private
SeaweedFS, the uploader and the store both on CPU 1 (as on a cluster node, where the upload has
host cores of its own). Each round measures the median step time with:

- nothing beside it (the reference);
- the upload in a thread of the training process (CheckpointSync);
- the upload in a child process (UploaderProcess, what every rank runs).

It prints each variant's step time over the reference's (1.00 = no slowdown). A thread shares
the training process's GIL even on another core; a process does not. Needs 2 CPUs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

from slurm_titan.ckpt import CheckpointSync, UploaderProcess, UploadSettings  # noqa: E402
from tests.support.s3 import S3Server  # noqa: E402

TRAIN_CPU, SIDE_CPU = 0, 1


def training_step() -> Callable[[], float]:
    """A step of a small MLP stack: many small operators, like the debug model's."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 768), torch.nn.GELU(),
                                                      torch.nn.Linear(768, 256), torch.nn.LayerNorm(256))
                                  for _ in range(6)])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 256, 256)

    def step() -> float:
        t = time.perf_counter()
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - t

    return step


def write_step(folder: Path, step: int, mib: int) -> None:
    d = folder / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "__0_0.distcp").write_bytes(os.urandom(mib << 20))
    (d / ".metadata").write_bytes(b"bench")


def uploading(make: Callable[[str, Path], object], url: str, work: Path, mib: int,
              stop: threading.Event) -> None:
    """Upload step after step with a fresh uploader each time (`make(url, local)`) until `stop`."""
    os.sched_setaffinity(0, {SIDE_CPU})  # this driver thread; the uploader chooses its own CPUs
    n = 0
    while not stop.is_set():
        n += 1
        local = work / f"local-{n}"
        write_step(local, n, mib)
        up = make(f"{url}/run-{n}", local)
        up.submit(n)  # type: ignore[attr-defined]
        up.wait(n)  # type: ignore[attr-defined]
        up.close()  # type: ignore[attr-defined]
        shutil.rmtree(local, ignore_errors=True)


def in_thread(url: str, local: Path) -> CheckpointSync:
    return CheckpointSync(url, str(local), attempt="bench", poll_interval=0.05, upload_cpus=frozenset({SIDE_CPU}))


def in_process(url: str, local: Path) -> UploaderProcess:
    uploader = UploaderProcess(UploadSettings(remote=url, local_folder=str(local), attempt="bench",
                                              upload_cpus=frozenset({SIDE_CPU})))
    uploader.ready()  # its start is not what is timed
    return uploader


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15, help="steps timed per variant and round")
    ap.add_argument("--shard-mib", type=int, default=36, help="size of each uploaded checkpoint")
    args = ap.parse_args()
    if not {TRAIN_CPU, SIDE_CPU} <= os.sched_getaffinity(0):
        raise SystemExit("needs CPUs 0 and 1")
    work = Path(tempfile.mkdtemp(prefix="bench-upload-interference-"))
    try:
        with S3Server(bucket="bench", data_dir=str(work / "s3")) as srv:
            os.environ.update(srv.env())
            for tid in os.listdir(f"/proc/{srv.server.running_pid()}/task"):
                os.sched_setaffinity(int(tid), {SIDE_CPU})
            os.sched_setaffinity(0, {TRAIN_CPU})
            step = training_step()
            for _ in range(5):
                step()  # warm-up
            times: dict[str, list[float]] = {"none": [], "thread": [], "process": []}
            for rnd in range(args.rounds):
                times["none"].append(statistics.median(step() for _ in range(args.steps)))
                for name, make in (("thread", in_thread), ("process", in_process)):
                    stop = threading.Event()
                    driver = threading.Thread(target=uploading, args=(make, srv.url(f"{name}-{rnd}"), work,
                                                                      args.shard_mib, stop))
                    driver.start()
                    time.sleep(2.0)  # the uploads are under way
                    times[name].append(statistics.median(step() for _ in range(args.steps)))
                    stop.set()
                    driver.join()
                print(f"round {rnd + 1}: step s " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in times.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = statistics.median(times["none"])
    for name in ("thread", "process"):
        ratios = [t / n for t, n in zip(times[name], times["none"])]
        print(f"upload in a {name:8s}: step time {statistics.median(times[name]):.3f} s vs {ref:.3f} s alone: "
              f"{statistics.median(times[name]) / ref:.2f}x (per round {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
