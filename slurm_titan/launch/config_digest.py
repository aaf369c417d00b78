"""The config digest every commit record keeps, and which config changes a later job of the run may make.

    <16 hex: the whole torchtitan section> torchtitan.module=<8 hex> torchtitan.config=<8 hex> ...

The first word is the digest of the torchtitan section as before; then one digest per key that a checkpoint loads
only into (:data:`LOAD_KEYS`: the model's shape, the optimizer's kind, the tokenizer). Everything else may change
between the jobs of a run (steps, schedule, node count, checkpoint interval, data loader workers, ...): DCP
reshards, and the data loader keeps its position. A record of before (one word) names no key: nothing is checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import JobConfig

LOAD_KEYS = {
    "torchtitan.module": "the model",
    "torchtitan.config": "the model's shape",
    "torchtitan.args.model": "the model's shape",
    "torchtitan.args.optimizer.name": "the optimizer's kind",
    "tokenizer": "the tokenizer and its vocabulary",
}
"""What a checkpoint loads only into, by the config key that sets it (the tokenizer: the content of
`hf_assets_path`'s tokenizer files, or of `debug_assets`')."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json")


def _short(value: Any, size: int = 8) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:size]


def _tokenizer(config: JobConfig) -> tuple[str, Any]:
    """The key that names the job's tokenizer, and what identifies it: its files' content where the login node
    can read them, else where it is."""
    titan = config.torchtitan
    if titan.debug_assets:
        return "torchtitan.debug_assets", "debug-assets"  # generated the same way every time (launch.debug_assets)
    where = titan.option("hf_assets_path")
    folder = Path(str(where)) if where is not None and "://" not in str(where) else None
    files = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in TOKENIZER_FILES
             if folder is not None and (folder / name).is_file()}
    return "torchtitan.args.hf_assets_path", files or where


def load_values(config: JobConfig) -> dict[str, Any]:
    """The values of :data:`LOAD_KEYS` in `config`."""
    titan = config.torchtitan
    return {"torchtitan.module": titan.module, "torchtitan.config": titan.config,
            "torchtitan.args.model": titan.option("model"), "torchtitan.args.optimizer.name":
            titan.option("optimizer.name"), "tokenizer": _tokenizer(config)[1]}


def config_digest(config: JobConfig) -> str:
    """The digest a commit record keeps (see the module's docstring)."""
    whole = _short(dataclasses.asdict(config.torchtitan), 16)
    return " ".join([whole, *(f"{key}={_short(value)}" for key, value in load_values(config).items())])


def _keys(digest: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in digest.split()[1:] if "=" in word)


def check_change(config: JobConfig, saved: str, where: str) -> None:
    """ConfigError (naming the key) when `config` cannot load a checkpoint whose record keeps `saved`."""
    before, now = _keys(saved), _keys(config_digest(config))
    for key, what in LOAD_KEYS.items():
        if key in before and before[key] != now.get(key):
            name = _tokenizer(config)[0] if key == "tokenizer" else key
            raise ConfigError(config.source, name, f"differs from the job that saved {where}: a checkpoint loads only "
                                                   f"into {what} that saved it; change it in a new run (--run NAME)")
