"""The ckpt-api contract protects every module of ckpt but its public ones (``__init__`` and ``layout``): a new module
is protected as soon as it exists, and every name in ``__all__`` is importable from ``slurm_titan.ckpt``."""

import pkgutil
import tomllib
from pathlib import Path

import slurm_titan.ckpt as ckpt

REPO = Path(__file__).resolve().parents[3]
PUBLIC_MODULES = {"slurm_titan.ckpt.layout"}


def test_every_private_module_is_protected():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    protected = set(next(c for c in contracts if c["id"] == "ckpt-api")["protected_modules"])
    modules = {f"slurm_titan.ckpt.{m.name}" for m in pkgutil.iter_modules(ckpt.__path__)}
    assert protected == modules - PUBLIC_MODULES


def test_every_exported_name_exists():
    assert all(hasattr(ckpt, name) for name in ckpt.__all__)
