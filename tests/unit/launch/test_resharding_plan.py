"""The plan activates the resharding data loader (torch-free: the login-node path)."""

from __future__ import annotations

import pytest

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config, parse_assignment
from slurm_titan.launch.plan import _titan_options, default_overrides
from slurm_titan.overrides import RESHARDING_DATALOADER
from tests.support.paths import REPO

CONFIG = REPO / "configs/debug_cpu.yaml"


def overrides_of(*sets: str) -> list:
    from torchtitan.config.override import parse_cli_imports

    config = load_config(CONFIG, [parse_assignment(s) for s in sets])
    argv = _titan_options(config, default_overrides(config))
    start = argv.index("--override.imports") + 1
    tokens = [t for t in argv[start:] if not t.startswith("-") and ":" not in t.partition("=")[0]]
    return parse_cli_imports(tokens)


def test_checkpointed_jobs_get_the_resharding_loader() -> None:
    assert RESHARDING_DATALOADER in overrides_of()


def test_restart_data_keeps_torchtitans_loader() -> None:
    assert RESHARDING_DATALOADER not in overrides_of("checkpoint.on_world_size_change=restart_data")
    assert RESHARDING_DATALOADER not in overrides_of("checkpoint.enable=false", "checkpoint.remote=null")


def test_allowed_dataset_change_reaches_the_override_as_kwargs() -> None:
    got = overrides_of("checkpoint.allow_dataset_change=true")
    assert (RESHARDING_DATALOADER, {"allow_dataset_change": True}) in got
    assert RESHARDING_DATALOADER not in got and len(got) >= 3  # the other targets still parse


def test_unknown_world_size_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="checkpoint.on_world_size_change"):
        load_config(CONFIG, [parse_assignment("checkpoint.on_world_size_change=skip")])


def test_target_names_a_registered_override() -> None:
    import importlib

    from torchtitan.config.override import _REGISTRY

    importlib.import_module(RESHARDING_DATALOADER.rpartition(".")[0])
    assert _REGISTRY[RESHARDING_DATALOADER].fqns == ["dataloader"]
