"""Loader throughput with and without the resharding data loader, on the debug dataset, in one run.

Both loaders read the debug dataset (slurm_titan.launch.debug_assets) with its tokenizer at seq_len 256,
local batch 4, as one rank of `--degree`; rounds alternate between the two, and the ratio
(resharding / torchtitan, tokens per second) is the median over rounds. Goal: >= 0.98.

    python -m tools.bench.reshard_loader --assets .cache/debug-assets --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tokens_per_second(cls: type, assets: Path, degree: int, batches: int, seq_len: int, batch: int) -> float:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets / "tokenizer"))
    config = cls.Config(dataset="c4_test", dataset_path=str(assets / "dataset"), infinite=True)
    loader = cls(config, dp_world_size=degree, dp_rank=0, tokenizer=tokenizer, seq_len=seq_len,
                 local_batch_size=batch)
    it = iter(loader)
    next(it)  # the dataset's first read (arrow files opened) is not the loader's throughput
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * batch * seq_len / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, default=REPO / ".cache/debug-assets")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--degree", type=int, default=1)
    args = parser.parse_args(argv)

    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    from slurm_titan.launch.debug_assets import ensure_assets
    from slurm_titan.overrides.resharding_loader import ReshardingDataLoader

    ensure_assets(args.assets)
    ratios = []
    for round_ in range(args.rounds):
        order = (HuggingFaceTextDataLoader, ReshardingDataLoader)[:: 1 if round_ % 2 else -1]
        rate = {cls: tokens_per_second(cls, args.assets, args.degree, args.batches, 256, 4) for cls in order}
        ratios.append(rate[ReshardingDataLoader] / rate[HuggingFaceTextDataLoader])
        print(f"round {round_ + 1}: torchtitan {rate[HuggingFaceTextDataLoader]:,.0f} tok/s, "
              f"resharding {rate[ReshardingDataLoader]:,.0f} tok/s, ratio {ratios[-1]:.3f}")
    print(f"median ratio (resharding / torchtitan): {statistics.median(ratios):.3f} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
