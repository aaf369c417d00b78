"""Loader throughput with and without the resharding data loader, on the debug dataset, in one run.

Both loaders read the debug dataset (slurm_titan.launch.debug_assets) with its tokenizer at seq_len 256,
local batch 4, as one rank of `--degree`; rounds alternate between the two, and the ratio
(resharding / torchtitan, tokens per second) is the median over rounds, with its spread (lowest-highest).
Goal: >= 0.98. The ratio of CPU seconds (the process's, per token) is printed too: on a shared machine the
wall-clock ratio moves with the other processes' load, the CPU one much less.

    python -m tools.bench.reshard_loader --assets .cache/debug-assets --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tokens_per_second(cls: type, assets: Path, degree: int, batches: int, seq_len: int,
                      batch: int) -> tuple[float, float]:
    """(tokens per wall-clock second, tokens per CPU second of this process) of `batches` batches."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets / "tokenizer"))
    config = cls.Config(dataset="c4_test", dataset_path=str(assets / "dataset"), infinite=True)
    loader = cls(config, dp_world_size=degree, dp_rank=0, tokenizer=tokenizer, seq_len=seq_len,
                 local_batch_size=batch)
    it = iter(loader)
    next(it)  # the dataset's first read (arrow files opened) is not the loader's throughput
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    tokens = batches * batch * seq_len
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu)


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
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for round_ in range(args.rounds):
        order = (HuggingFaceTextDataLoader, ReshardingDataLoader)[:: 1 if round_ % 2 else -1]
        rate = {cls: tokens_per_second(cls, args.assets, args.degree, args.batches, 256, 4) for cls in order}
        (titan, titan_cpu), (ours, ours_cpu) = rate[HuggingFaceTextDataLoader], rate[ReshardingDataLoader]
        ratios.append(ours / titan)
        cpu_ratios.append(ours_cpu / titan_cpu)
        print(f"round {round_ + 1}: torchtitan {titan:,.0f} tok/s, resharding {ours:,.0f} tok/s, "
              f"ratio {ratios[-1]:.3f} (CPU time: {cpu_ratios[-1]:.3f})")
    for name, values in (("", ratios), ("CPU-time ", cpu_ratios)):
        print(f"median {name}ratio (resharding / torchtitan): {statistics.median(values):.3f} over {args.rounds} "
              f"rounds, spread {min(values):.3f}-{max(values):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
