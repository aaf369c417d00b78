"""Test-only torchtitan override (tests/e2e/test_hang.py): the `streamed_test` dataset, the JSON-lines shards
`train-*.jsonl` of a local folder read lazily with plain reads (datasets' own file resolution skips a FIFO),
one shard per rank (split_dataset_by_node), so that a rank reads its shard while it trains."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from datasets import IterableDataset
from torchtitan.config import derive, override
from torchtitan.hf_datasets import text_datasets


def _documents(shards: list[str]) -> Iterator[dict]:
    for shard in shards:
        with open(shard, encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)


def _load(path: str) -> IterableDataset:
    shards = sorted(str(p) for p in Path(path).glob("train-*.jsonl"))
    return IterableDataset.from_generator(_documents, gen_kwargs={"shards": shards})


text_datasets.DATASETS["streamed_test"] = text_datasets.DatasetConfig(
    path="", loader=_load, sample_processor=lambda sample: sample["text"])


class StreamedTextDataLoader(text_datasets.HuggingFaceTextDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(text_datasets.HuggingFaceTextDataLoader.Config):
        pass


@override(target=text_datasets.HuggingFaceTextDataLoader.Config, exact=True,
          description="tests: register the streamed_test dataset")
def streamed_dataset(cfg: text_datasets.HuggingFaceTextDataLoader.Config) -> StreamedTextDataLoader.Config:
    return derive(cfg, StreamedTextDataLoader.Config)
