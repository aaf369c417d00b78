"""The plan activates the token-shard data loader for `dataloader.dataset: token_shards` (torch-free)."""

from __future__ import annotations

from slurm_titan.overrides import RESHARDING_DATALOADER, TOKEN_SHARD_DATALOADER
from tests.unit.launch.test_resharding_plan import overrides_of

SHARDS = ("torchtitan.args.dataloader.dataset=token_shards", "torchtitan.args.dataloader.dataset_path=/shared/tok")


def test_token_shards_replace_the_resharding_loader() -> None:
    got = overrides_of(*SHARDS)
    assert TOKEN_SHARD_DATALOADER in got and RESHARDING_DATALOADER not in got


def test_token_shards_need_their_loader_without_checkpoints_too() -> None:
    assert TOKEN_SHARD_DATALOADER in overrides_of(*SHARDS, "checkpoint.enable=false", "checkpoint.remote=null")


def test_the_checkpoint_policies_reach_the_override_as_kwargs() -> None:
    got = overrides_of(*SHARDS, "checkpoint.allow_dataset_change=true", "checkpoint.on_world_size_change=restart_data")
    assert (TOKEN_SHARD_DATALOADER, {"allow_dataset_change": True, "restart_data": True}) in got


def test_target_names_a_registered_override() -> None:
    import importlib

    from torchtitan.config.override import _REGISTRY

    importlib.import_module(TOKEN_SHARD_DATALOADER.rpartition(".")[0])
    assert _REGISTRY[TOKEN_SHARD_DATALOADER].fqns == ["dataloader"]


def test_a_store_location_is_not_looked_for_on_the_login_node() -> None:
    from slurm_titan.launch.config import load_config, parse_assignment
    from slurm_titan.launch.plan import _check_torchtitan
    from tests.unit.launch.test_resharding_plan import CONFIG

    sets = [SHARDS[0], "torchtitan.args.dataloader.dataset_path=s3://bucket/tokens"]
    _check_torchtitan(load_config(CONFIG, [parse_assignment(s) for s in sets]))
