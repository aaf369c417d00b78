"""Override: torchtitan's text data loader -> one that trains on pre-tokenized token shards, with a data
position that loads on any data-parallel degree.

    --dataloader.dataset token_shards --dataloader.dataset_path /shared/tokens/c4   (or s3://bucket/tokens/c4)
    --override.imports slurm_titan.overrides.token_shard_loader.token_shard_dataloader

The shards (Megatron ``.bin`` + ``.idx`` and a manifest, :mod:`slurm_titan.data.token_manifest`; made by
``slurm-titan data prepare``) are checked at start against the job's tokenizer and each other
(:class:`slurm_titan.data.token_shards.TokenShards`). Their documents are the rows of the resharding
loader's plan (:mod:`slurm_titan.data.cursor`), packed as torchtitan packs tokenised text
(:class:`.plan_packing.PlanPackedDataset`): a document prepared from a text with the job's tokenizer yields
the tokens, positions and labels that the resharding loader yields for that text. The state, its gathering
into one entry any degree loads, the fingerprint check and the reshard are the resharding loader's
(:class:`.resharding_loader.ReshardingDataLoader`); the fingerprint is the manifest's content digest.
Epoch 0 reads each rank's contiguous share in order; later epochs a permutation of it seeded by
``seed + epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import derive, override
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

from slurm_titan.data.cursor import SHUFFLE_SEED, DataResumeError, Piece
from slurm_titan.data.token_manifest import TokenizerInfo
from slurm_titan.data.token_names import TOKEN_SHARDS_DATASET
from slurm_titan.data.token_shards import TokenShards, plan_documents
from slurm_titan.overrides.plan_packing import Block, PlanPackedDataset
from slurm_titan.overrides.resharding_loader import ReshardingDataLoader


class TokenShardDataset(PlanPackedDataset):
    """The documents of :class:`TokenShards` over a plan, packed into ``seq_len`` sequences; read in blocks of
    about ``BLOCK_TOKENS`` tokens (a run of consecutive documents of a shard is one slice of its ``.bin``)."""

    BLOCK_TOKENS = 1 << 16
    WINDOW_DOCUMENTS = 1 << 16
    """Documents whose numbers and lengths are worked out at a time (a rank's share can be billions)."""

    def __init__(self, shards: TokenShards, seq_len: int, dp_rank: int, dp_world_size: int, infinite: bool,
                 seed: int = SHUFFLE_SEED) -> None:
        self.shards, self.seed = shards, seed
        super().__init__(TOKEN_SHARDS_DATASET, seq_len, dp_rank, dp_world_size, infinite)

    @property
    def rows(self) -> int:
        return self.shards.documents

    @property
    def read_ahead(self) -> int:
        return max(self.seq_len, self.BLOCK_TOKENS)

    def _read(self, piece: Piece, start: int) -> Iterator[Block]:
        for lo in range(start, piece.end, self.WINDOW_DOCUMENTS):
            numbers = plan_documents(replace(piece, begin=lo, end=min(lo + self.WINDOW_DOCUMENTS, piece.end)),
                                     self.seed)
            lengths = self.shards.lengths(numbers)
            block = (np.cumsum(lengths) - lengths) // self.BLOCK_TOKENS  # the block each document starts in
            bounds = [0, *(np.flatnonzero(np.diff(block)) + 1).tolist(), len(numbers)]
            for first, end in zip(bounds, bounds[1:]):
                yield self.shards.read(numbers[first:end])


class TokenShardDataLoader(ReshardingDataLoader):
    """The resharding loader's state and reshard over a :class:`TokenShardDataset`."""

    @dataclass(kw_only=True, slots=True)
    class Config(ReshardingDataLoader.Config):
        seed: int = SHUFFLE_SEED
        """The shuffle of epochs after the first (a permutation of each rank's share, seeded by seed + epoch)."""
        restart_data: bool = False
        """Restart the data on another data-parallel degree (checkpoint.on_world_size_change: restart_data)."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs: Any) -> None:
        self.refuse_workers(config)
        if not config.dataset_path:
            raise DataResumeError(f"dataloader.dataset {TOKEN_SHARDS_DATASET} reads the folder or s3:// location that "
                                  "dataloader.dataset_path names: none is set")
        shards = TokenShards.open(config.dataset_path, TokenizerInfo.of(tokenizer))
        self.allow_dataset_change, self.reshards = config.allow_dataset_change, not config.restart_data
        self.fingerprint = shards.manifest.fingerprint(shards.location)
        dataset = TokenShardDataset(shards, seq_len, dp_rank, dp_world_size, config.infinite, config.seed)
        self.start(dataset, config, dp_rank=dp_rank, dp_world_size=dp_world_size, local_batch_size=local_batch_size,
                   snapshot_every_n_steps=snapshot_every_n_steps)


@override(
    target=HuggingFaceTextDataLoader.Config,
    fqns=["dataloader"],  # the trainer's loader, the one checkpointed (not validator.dataloader)
    exact=True,
    description="slurm-titan: train on pre-tokenized token shards, with a data position that reshards",
)
def token_shard_dataloader(cfg: HuggingFaceTextDataLoader.Config, allow_dataset_change: bool = False,
                           restart_data: bool = False, seed: int = SHUFFLE_SEED) -> TokenShardDataLoader.Config:
    return derive(cfg, TokenShardDataLoader.Config, allow_dataset_change=allow_dataset_change,
                  restart_data=restart_data, seed=seed)
