"""Find torchtitan's config functions without importing torchtitan (which imports torch)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

_REGISTRY_PACKAGES = ("models", "experiments")


def _torchtitan_root() -> Path | None:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def config_functions(module: str) -> set[str] | None:
    """Names of the config functions in torchtitan's `<module>/config_registry.py`.

    None when torchtitan is not installed here or the module is not one of its own (a fully
    qualified module path outside torchtitan); the node then checks at start.
    """
    root = _torchtitan_root()
    if root is None:
        return None
    for package in _REGISTRY_PACKAGES:
        path = root / package / module.replace(".", "/") / "config_registry.py"
        if path.is_file():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            return {node.name for node in tree.body
                    if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}
    return None
