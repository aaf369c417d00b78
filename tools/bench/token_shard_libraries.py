"""Reading the same token documents from MosaicML `streaming` (MDS), Lightning `litdata` and our Megatron
reader (slurm_titan.data.token_shards), in one run: tokens per CPU-second of one process reading every
document once, in order. Neither library is a dependency of the project: run this in a scratch virtual
environment that has them (`pip install mosaicml-streaming litdata` beside the project's packages).

The documents are the debug dataset's (`--documents`), tokenised once by `slurm-titan data prepare`'s code;
each library gets them as one variable-length uint16 array per sample, written with its own writer.

    python -m tools.bench.token_shard_libraries --documents 20000
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np


def measure(name: str, documents: Callable[[], Iterable[np.ndarray]], expected: int) -> None:
    start, cpu, tokens = time.perf_counter(), time.process_time(), 0
    for tokens_of_one in documents():
        tokens += len(tokens_of_one)
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    assert tokens == expected, (name, tokens, expected)
    print(f"{name:<32} {tokens / used:>14,.0f} tokens per CPU-s  {tokens / wall:>14,.0f} tokens/s")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20000)
    args = parser.parse_args(argv)

    from litdata import StreamingDataset as LitDataset
    from litdata import optimize
    from streaming import MDSWriter
    from streaming import StreamingDataset as MdsDataset

    from slurm_titan.data import prepare
    from slurm_titan.data.token_shards import TokenShards
    from slurm_titan.launch.debug_assets import write_dataset, write_tokenizer
    from slurm_titan.overrides import shard_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-token-libraries-"))
    try:
        write_dataset(work / "dataset", args.documents)
        write_tokenizer(work / "tokenizer")
        info = shard_tokenizer.describe(str(work / "tokenizer"))
        manifest = prepare.prepare([str(work / "dataset")], work / "megatron", tokenizer_dir=str(work / "tokenizer"),
                                   tokenizer=info, make_shard=shard_tokenizer.make_shard, documents_per_shard=5000,
                                   workers=2).manifest
        shards = TokenShards.open(str(work / "megatron"), info)
        docs = [shards.document(n).copy() for n in range(shards.documents)]

        with MDSWriter(out=str(work / "mds"), columns={"tokens": "ndarray:uint16"}, size_limit=1 << 26) as out:
            for doc in docs:
                out.write({"tokens": doc})
        optimize(fn=_litdata_sample, inputs=docs, output_dir=str(work / "litdata"), chunk_bytes="64MB",
                 num_workers=1, mode="overwrite")
        for name in ("megatron", "mds", "litdata"):
            print(f"{name}: {folder_bytes(work / name):,} bytes on disk for {manifest.tokens:,} tokens")

        numbers = np.arange(shards.documents)
        measure("ours, runs of documents", lambda: _runs(shards, numbers), manifest.tokens)
        measure("ours, one document at a time", lambda: (shards.document(n) for n in range(shards.documents)),
                manifest.tokens)
        mds = MdsDataset(local=str(work / "mds"), batch_size=1, shuffle=False)
        measure("streaming (MDS), by sample", lambda: (sample["tokens"] for sample in mds), manifest.tokens)
        lit = LitDataset(str(work / "litdata"), shuffle=False)
        measure("litdata, by sample", lambda: (sample["tokens"] for sample in lit), manifest.tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _litdata_sample(doc: np.ndarray) -> dict[str, np.ndarray]:
    return {"tokens": doc}


def _runs(shards: object, numbers: np.ndarray) -> Iterable[np.ndarray]:
    for lo in range(0, len(numbers), 512):
        yield shards.read(numbers[lo:lo + 512])[0]  # type: ignore[attr-defined]


if __name__ == "__main__":
    raise SystemExit(main())
