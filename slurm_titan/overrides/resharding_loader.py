"""Override: torchtitan's text data loader, with a data position that survives a change of data-parallel degree.

    --override.imports slurm_titan.overrides.resharding_loader.resharding_dataloader

torchtitan's ``ParallelAwareDataloader`` keeps one state per data-parallel rank and refuses another
degree ("dp_degree is inconsistent", torchtitan#811). This loader reads map-style datasets (JSON lines
given with ``--dataloader.dataset-path``, or any ``datasets.Dataset``) with the plan of
:mod:`slurm_titan.data.cursor`: on an unchanged degree each rank reads, packs and yields exactly what
torchtitan's ``HuggingFaceTextDataset`` does; its state is a per-rank cursor (plan, oldest sample with
tokens in the buffer, their token offset), gathered from every rank at save into one entry that any
degree can load. On another degree the unconsumed samples are re-split: each is read exactly once, a
sample cut by the checkpoint goes on at its token offset. Streaming (iterable) datasets run
torchtitan's own dataset unchanged and resume on the same degree only: another one is refused.

The gathered state sits under torchtitan's ``world_size`` key (pickled, as torchtitan pickles its
per-rank states), so that the template DCP loads into has the same keys on every degree, and a
checkpoint of torchtitan's loader (whose ``world_size`` is a bare int) is recognised and refused in one
line. The state carries the dataset's fingerprint (:mod:`slurm_titan.data.identity`).
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist
from datasets import Dataset
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import derive, override
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader, HuggingFaceTextDataset, _validate_dataset

from slurm_titan.data import identity
from slurm_titan.data.cursor import (
    SHUFFLE_SEED,
    DataResumeError,
    Piece,
    base_rows,
    pieces_from_tuples,
    plan_length,
    remaining,
    reshard,
    rows_needed,
)
from slurm_titan.overrides.document_tables import collate_with_tables
from slurm_titan.overrides.plan_packing import Block, PlanPackedDataset

log = logging.getLogger("slurm_titan.overrides.resharding_loader")

STATE_FORMAT = "slurm-titan-reshardable-data/1"
STATE_KEY = "world_size"
"""torchtitan's ParallelAwareDataloader key that every degree has (see the module docstring)."""

BLOCK_ROWS = 16
"""Documents tokenised into one block of the packing buffer (one block a document costs ~40 us of numpy a
document; a few documents read ahead of the sequence that needs them change no sequence)."""

READ_ROWS = 256
"""Rows read from the dataset at a time: row by row, datasets formats an arrow slice per row (19 ms per 4,000
debug rows, 50 ms shuffled; in batches of 256: 1 and 6 ms)."""


def _rows(data: Dataset) -> Iterator[Any]:
    """``data``'s rows as iterating over it yields them, read ``READ_ROWS`` at a time."""
    if data.format["type"] is not None:  # a formatted batch (numpy, torch, ...) is not a list per column
        yield from data
        return
    for batch in data.iter(batch_size=READ_ROWS):
        for values in zip(*batch.values()):
            yield dict(zip(batch, values))


class ReshardableTextDataset(PlanPackedDataset):
    """torchtitan's ``HuggingFaceTextDataset`` over a :class:`~slurm_titan.data.cursor.Piece` plan: same
    tokenisation, per-epoch reshuffle (seed 42 + epoch) and packing (:class:`.plan_packing.PlanPackedDataset`)."""

    def __init__(self, data: Dataset, name: str, text_processor: Callable[[Any], str], tokenizer: BaseTokenizer,
                 seq_len: int, dp_rank: int, dp_world_size: int, infinite: bool) -> None:
        self._base, self._text, self._tokenizer = data, text_processor, tokenizer
        self._views: dict[tuple[int, int, int, int], Dataset] = {}
        super().__init__(name, seq_len, dp_rank, dp_world_size, infinite)

    @property
    def rows(self) -> int:
        return len(self._base)

    def _view(self, piece: Piece) -> Dataset:
        """The shard's rows in the epoch's order: torchtitan's ``shard(contiguous=True)`` (= ``select(range)``)
        and ``shuffle(seed=42 + epoch)`` after epoch 0."""
        key = (piece.rows, piece.shards, piece.shard, piece.epoch)
        if key not in self._views:
            view = self._base.select(base_rows(piece))
            self._views[key] = view.shuffle(seed=SHUFFLE_SEED + piece.epoch) if piece.epoch else view
        return self._views[key]

    def _read(self, piece: Piece, start: int) -> Iterator[Block]:
        """Blocks of ``BLOCK_ROWS`` documents, each tokenised as torchtitan does (BOS and EOS added)."""
        view = self._view(piece)
        rows = view.select(range(start, piece.end)) if start or piece.end != len(view) else view
        texts = (self._text(row) for row in _rows(rows))
        while block := [self._tokenizer.encode(text, add_bos=True, add_eos=True)
                        for text in itertools.islice(texts, BLOCK_ROWS)]:
            yield (np.fromiter(itertools.chain.from_iterable(block), dtype=np.int64),
                   np.fromiter(map(len, block), dtype=np.int64, count=len(block)))


def _all_gather(entry: object) -> list[object]:
    """Every rank's ``entry`` (all ranks of the default group; this rank's alone without one)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [entry]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, entry)
    return gathered


def _dataset_fingerprint(name: str, path: str, data: object, text: Callable[[Any], str]) -> dict[str, Any]:
    if isinstance(data, Dataset):
        head = (text(row) for row in data.select(range(min(len(data), identity.HEAD_ROWS))))
        return identity.fingerprint(name, path, "map-style", len(data), head)
    return identity.fingerprint(name, path, "streaming", None, None)


class ReshardingDataLoader(ParallelAwareDataloader):
    """``HuggingFaceTextDataLoader`` whose checkpointed position loads on any data-parallel degree."""

    reshards = True
    """Read by the checkpoint hook: this loader's state is to be loaded even when the world size changed."""

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        allow_dataset_change: bool = False
        """Resume a checkpoint whose dataset fingerprint differs from this dataset's
        (checkpoint.allow_dataset_change)."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs: Any) -> None:
        self.refuse_workers(config)
        path, load, text = _validate_dataset(config.dataset.lower(), config.dataset_path)
        data = load(path)
        self.allow_dataset_change = config.allow_dataset_change
        self.fingerprint = _dataset_fingerprint(config.dataset.lower(), path, data, text)
        if isinstance(data, Dataset):
            dataset: IterableDataset = ReshardableTextDataset(data, config.dataset.lower(), text, tokenizer, seq_len,
                                                              dp_rank, dp_world_size, config.infinite)
        else:  # streaming: torchtitan's own dataset (it loads the stream again: lazily, nothing is read twice)
            dataset = HuggingFaceTextDataset(config.dataset, config.dataset_path, tokenizer, seq_len, dp_rank,
                                             dp_world_size, config.infinite)
        self.start(dataset, config, dp_rank=dp_rank, dp_world_size=dp_world_size, local_batch_size=local_batch_size,
                   snapshot_every_n_steps=snapshot_every_n_steps)

    @staticmethod
    def refuse_workers(config: Config) -> None:
        if config.num_workers:
            raise DataResumeError(f"dataloader.num_workers={config.num_workers}: the resharding data loader reads "
                                  "in the training process only (num_workers: 0)")

    def start(self, dataset: IterableDataset, config: Config, *, dp_rank: int, dp_world_size: int,
              local_batch_size: int, snapshot_every_n_steps: int | None) -> None:
        """torchtitan's loader over ``dataset``, batches collated with their document tables."""
        ParallelAwareDataloader.__init__(self, dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                         batch_size=local_batch_size, pin_memory=config.pin_memory,
                                         snapshot_every_n_steps=snapshot_every_n_steps,
                                         collate_fn=collate_with_tables)

    @property
    def streaming(self) -> bool:
        return not isinstance(self.dataset, PlanPackedDataset)

    # -- saving -----------------------------------------------------------------------------
    def local_state(self) -> bytes:
        """This rank's part: its cursor (map-style) or torchtitan's whole per-rank state (streaming)."""
        if self.streaming:
            return pickle.dumps(StatefulDataLoader.state_dict(self))
        return pickle.dumps(self.dataset.state_dict())

    def global_state(self, entries: list[tuple[int, bytes]]) -> dict[str, Any]:
        """The checkpoint entry from every data-parallel rank's (dp_rank, local_state) (replicas repeat them)."""
        ranks = dict(reversed(entries))
        if sorted(ranks) != list(range(self.dp_world_size)):
            raise RuntimeError(f"data loader state: got data-parallel ranks {sorted(ranks)}, "
                               f"expected 0..{self.dp_world_size - 1}")
        state = {"format": STATE_FORMAT, "dp_world_size": self.dp_world_size, "dataset": self.fingerprint,
                 "ranks": [ranks[r] for r in range(self.dp_world_size)]}
        return {STATE_KEY: pickle.dumps(state)}

    def state_dict(self) -> dict[str, Any]:
        """Collective: every rank calls it in DCP's save (and load) of the checkpoint."""
        return self.global_state(_all_gather((self.dp_rank, self.local_state())))  # type: ignore[arg-type]

    # -- loading ----------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        saved = self._saved(state_dict.get(STATE_KEY))
        self._check_dataset(saved["dataset"])
        if saved["dataset"]["kind"] != self.fingerprint["kind"]:
            raise DataResumeError(f"the checkpoint's data position is for a {saved['dataset']['kind']} dataset, this "
                                  f"one is {self.fingerprint['kind']}: it cannot go on there")
        old_degree, ranks = saved["dp_world_size"], saved["ranks"]
        if self.streaming:
            if old_degree != self.dp_world_size:
                raise DataResumeError(
                    f"the data position of streaming (iterable) dataset {self.fingerprint['name']!r} cannot be "
                    f"resharded from {old_degree} to {self.dp_world_size} data-parallel ranks; resume on "
                    f"{old_degree}, or set checkpoint.on_world_size_change: restart_data to restart its data")
            StatefulDataLoader.load_state_dict(self, pickle.loads(ranks[self.dp_rank]))
            return
        cursors = [pickle.loads(raw) for raw in ranks]
        rests = [remaining(pieces_from_tuples(c["pieces"]), c["first"], c["offset"]) for c in cursors]
        if old_degree == self.dp_world_size:
            plan, epoch = rests[self.dp_rank], cursors[self.dp_rank]["epoch"]
        else:
            plan, epoch = reshard(rests, self.dp_world_size)[self.dp_rank], max(c["epoch"] for c in cursors)
            if self.dp_rank == 0:
                log.warning("slurm-titan: data position resharded from %d to %d data-parallel ranks: %d unconsumed "
                            "samples of epoch(s) %s re-split, none repeated or skipped; the cut ones go on at their "
                            "token offset", old_degree, self.dp_world_size, sum(map(plan_length, rests)),
                            sorted({c["epoch"] for c in cursors}))
        needed = rows_needed(plan)
        if needed > self.dataset.rows:
            raise DataResumeError(f"dataset {self.fingerprint['path']} has {self.dataset.rows} rows but the "
                                  f"checkpoint's data position needs {needed}; resume on the dataset it was saved with")
        self.dataset.resume(plan, epoch)
        StatefulDataLoader.load_state_dict(self, {})  # drop an iterator made for DCP's template: read from the plan

    def _saved(self, raw: object) -> dict[str, Any]:
        if not isinstance(raw, bytes):
            raise DataResumeError(
                "the checkpoint's data loader state was saved by torchtitan's own loader (one state per data-parallel "
                f"rank, saved by {raw} ranks): it has no resharding cursor; resume it with "
                "checkpoint.on_world_size_change: restart_data (torchtitan's loader)")
        saved = pickle.loads(raw)
        if not isinstance(saved, dict) or saved.get("format") != STATE_FORMAT:
            raise DataResumeError(f"the checkpoint's data loader state is not in the format {STATE_FORMAT}")
        return saved

    def _check_dataset(self, saved: dict[str, Any]) -> None:
        changed = identity.difference(saved, self.fingerprint)
        if changed and not self.allow_dataset_change:
            raise DataResumeError(f"the checkpoint was trained on another dataset ({changed}); resume on it, or set "
                                  "checkpoint.allow_dataset_change: true to go on at the same sample positions")
        if changed:
            log.warning("slurm-titan: dataset changed since the checkpoint (%s): going on at the same sample "
                        "positions (checkpoint.allow_dataset_change)", changed)
        elif saved.get("path") != self.fingerprint["path"]:
            log.info("slurm-titan: same dataset content at another path: %s -> %s", saved.get("path"),
                     self.fingerprint["path"])


@override(
    target=HuggingFaceTextDataLoader.Config,
    fqns=["dataloader"],  # the trainer's loader, the one checkpointed (not validator.dataloader)
    exact=True,
    description="slurm-titan: a data loader position that reshards on another data-parallel degree",
)
def resharding_dataloader(cfg: HuggingFaceTextDataLoader.Config,
                          allow_dataset_change: bool = False) -> ReshardingDataLoader.Config:
    return derive(cfg, ReshardingDataLoader.Config, allow_dataset_change=allow_dataset_change)
