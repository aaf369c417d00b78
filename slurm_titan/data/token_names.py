"""The name and the error of token-shard datasets (torch- and numpy-free: the login node's plan reads them)."""

from slurm_titan.errors import SlurmTitanError

TOKEN_SHARDS_DATASET = "token_shards"
"""The ``dataloader.dataset`` that makes a job read token shards from ``dataloader.dataset_path``."""


class ShardError(SlurmTitanError):
    """A token shard (or its manifest) is missing, truncated or inconsistent: one line naming the file."""
