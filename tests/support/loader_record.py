"""Test-only torchtitan override (tests/test_e2e_reshard.py): the resharding data loader records what it yields.

Importing this module wraps `ReshardingDataLoader`'s iterator: every batch, as it is handed to training, is
appended to `$SLURM_TITAN_JOB_DIR/data-record/dp<data-parallel rank>-rank<RANK>.jsonl`, one line per batch with
its `input` token ids (the tensor training consumes) and the attempt. tests/sample_ids.py reads them back.

The plan's resharding loader override already claims the trainer's `dataloader` node (torchtitan refuses two
overrides of one node), so `record_yielded_batches`, the name that `--override.imports` needs, claims none:
its target is the resharding loader's own config, which the config tree only holds once overrides are applied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchtitan.config import override

from slurm_titan.overrides.resharding_loader import ReshardingDataLoader
from tests.support.sample_ids import RECORD_DIR

Iterate = Callable[[ReshardingDataLoader], Iterator[Any]]


def recording(iterate: Iterate) -> Iterate:
    """`iterate` (a loader's `__iter__`), appending each batch's input tokens to this rank's record first."""

    def recorded_iter(self: ReshardingDataLoader) -> Iterator[Any]:
        folder = Path(os.environ["SLURM_TITAN_JOB_DIR"]) / RECORD_DIR
        folder.mkdir(parents=True, exist_ok=True)
        attempt = os.environ.get("SLURM_TITAN_ATTEMPT", "")
        with (folder / f"dp{self.dp_rank}-rank{os.environ.get('RANK', '0')}.jsonl").open("a") as record:
            for batch in iterate(self):
                record.write(json.dumps({"attempt": attempt, "dp_rank": self.dp_rank,
                                         "input": batch[0]["input"].tolist()}) + "\n")
                record.flush()  # a rank that dies keeps what it consumed
                yield batch

    recorded_iter.records = True  # type: ignore[attr-defined]
    return recorded_iter


def install() -> None:
    """Record the batches of every `ReshardingDataLoader` (once: a second call changes nothing)."""
    if not getattr(ReshardingDataLoader.__iter__, "records", False):
        ReshardingDataLoader.__iter__ = recording(ReshardingDataLoader.__iter__)  # type: ignore[method-assign]


install()


@override(target=ReshardingDataLoader.Config, exact=True,
          description="tests: record the batches the resharding data loader yields (claims no node)")
def record_yielded_batches(cfg: ReshardingDataLoader.Config) -> ReshardingDataLoader.Config:
    return cfg
