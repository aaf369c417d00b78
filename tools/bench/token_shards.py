"""The token-shard loader against today's (resharding, tokenizing) loader on the same text, and its first batch
from a cold node-local cache against S3 (SeaweedFS), in one run.

The debug documents (slurm_titan.launch.debug_assets, `--documents` of them) are prepared once into token
shards with `slurm-titan data prepare`'s code; then rounds alternate the two loaders, each reading `--batches`
batches (seq_len 256, local batch 4, as one rank of one) after its first: tokens per wall-clock second and per
CPU second of the process (the shared machine's load moves the first, much less the second). Goal: >= 5x tokens
per CPU-second. Then, with a private SeaweedFS on loopback (`--no-s3` to skip), the shards are uploaded and the
time from building the loader to its first batch is measured from the shared folder, from S3 with an empty
node-local cache, and from S3 again with the cache filled (a restart on the node).

    python -m tools.bench.token_shards --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SEQ_LEN, BATCH = 256, 4


def loaders() -> tuple[type, type]:
    from slurm_titan.overrides.resharding_loader import ReshardingDataLoader
    from slurm_titan.overrides.token_shard_loader import TokenShardDataLoader

    return ReshardingDataLoader, TokenShardDataLoader


def build(cls: type, path: str, tokenizer: Any) -> Any:
    config = cls.Config(dataset="c4_test", dataset_path=path, infinite=True)
    return cls(config, dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=SEQ_LEN, local_batch_size=BATCH)


def rates(cls: type, path: str, tokenizer: Any, batches: int) -> tuple[float, float]:
    """(tokens per wall-clock second, tokens per CPU second of this process) of `batches` batches."""
    it = iter(build(cls, path, tokenizer))
    next(it)  # opening the dataset is not the loader's throughput
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    tokens = batches * BATCH * SEQ_LEN
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu)


def first_batch_s(cls: type, path: str, tokenizer: Any) -> float:
    start = time.perf_counter()
    next(iter(build(cls, path, tokenizer)))
    return time.perf_counter() - start


def prepare_shards(dataset: Path, tokenizer_dir: Path, output: Path, workers: int) -> tuple[Any, float]:
    from slurm_titan.data import prepare
    from slurm_titan.overrides import shard_tokenizer

    start = time.perf_counter()
    done = prepare.prepare([str(dataset)], output, tokenizer_dir=str(tokenizer_dir),
                           tokenizer=shard_tokenizer.describe(str(tokenizer_dir)),
                           make_shard=shard_tokenizer.make_shard, documents_per_shard=5000, workers=workers)
    return done.manifest, time.perf_counter() - start


def s3_latency(shards: Path, manifest: Any, tokenizer: Any, work: Path) -> dict[str, float]:
    """First-batch seconds: shared folder, S3 with a cold node-local cache, S3 with it filled."""
    from slurm_titan import envvars
    from slurm_titan.data import prepare
    from tools.local_s3.seaweed import Server, free_port

    server = Server(port=free_port(), data_dir=str(work / "s3"), bucket="bench")
    server.start(die_with_parent=True)
    try:
        os.environ.update(server.env())
        os.environ[envvars.DATA_CACHE] = str(work / "cache")
        location = "s3://bench/tokens"
        prepare.upload(shards, manifest, location)
        _, shard_cls = loaders()
        return {"shared folder": first_batch_s(shard_cls, str(shards), tokenizer),
                "S3, cold cache": first_batch_s(shard_cls, location, tokenizer),
                "S3, warm cache": first_batch_s(shard_cls, location, tokenizer)}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2, help="processes of the preparation")
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args(argv)

    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from slurm_titan.launch.debug_assets import write_dataset, write_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-token-shards-"))
    try:
        dataset, tokenizer_dir = work / "dataset", work / "tokenizer"
        write_dataset(dataset, args.documents)
        write_tokenizer(tokenizer_dir)
        manifest, prep_s = prepare_shards(dataset, tokenizer_dir, work / "shards", args.workers)
        print(f"prepared {manifest.documents:,} documents, {manifest.tokens:,} tokens in {len(manifest.shards)} "
              f"shards: {prep_s:.1f} s with {args.workers} workers ({manifest.tokens / prep_s:,.0f} tokens/s)")
        tokenizer = HuggingFaceTokenizer(tokenizer_path=str(tokenizer_dir))
        text_cls, shard_cls = loaders()
        wall, cpu = [], []
        for round_ in range(args.rounds):
            order = [(text_cls, str(dataset)), (shard_cls, str(work / "shards"))][:: 1 if round_ % 2 else -1]
            got = {cls: rates(cls, path, tokenizer, args.batches) for cls, path in order}
            (text, text_cpu), (shards, shards_cpu) = got[text_cls], got[shard_cls]
            wall.append(shards / text)
            cpu.append(shards_cpu / text_cpu)
            print(f"round {round_ + 1}: text loader {text:,.0f} tok/s ({text_cpu:,.0f} per CPU-s), token shards "
                  f"{shards:,.0f} tok/s ({shards_cpu:,.0f} per CPU-s): {wall[-1]:.1f}x, per CPU-s {cpu[-1]:.1f}x")
        for name, values in (("tokens/s", wall), ("tokens per CPU-second", cpu)):
            print(f"median ratio of {name} (token shards / text): {statistics.median(values):.1f}x over "
                  f"{args.rounds} rounds, spread {min(values):.1f}-{max(values):.1f}x")
        if not args.no_s3:
            for where, seconds in s3_latency(work / "shards", manifest, tokenizer, work).items():
                print(f"first batch from {where}: {seconds * 1000:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
