"""Run by the batch script before any node starts: does torchtitan know the job's config?

Catches a wrong `torchtitan.config` for modules the login node could not check (a module
outside torchtitan's own tree, or torchtitan not installed there). The message is the first
line of the job's log; the exit code is 2, like a config error at submit. The module and config
come from the job's batch spec (node.batch_spec).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from slurm_titan import titan_configs
from slurm_titan.node.batch_spec import load_or_exit


def available_configs(module: str) -> set[str]:
    """Config functions of a torchtitan module name or a fully qualified config_registry module."""
    names = titan_configs.config_functions(module)
    if names is not None:
        return names
    for candidate in (f"{module}.config_registry", module):
        try:
            registry = importlib.import_module(candidate)
        except ModuleNotFoundError:
            continue
        return {name for name, value in vars(registry).items() if callable(value) and not name.startswith("_")}
    return set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", type=Path, required=True)
    spec = load_or_exit(parser.parse_args(argv).job_dir)
    module, config = spec.titan_module, spec.titan_config
    names = available_configs(module)
    if config in names:
        return 0
    detail = f"known: {', '.join(sorted(n for n in names if n.startswith(module.rsplit('.', 1)[-1]))[:12])}" if names \
        else "the module was not found"
    print(f"slurm-titan: torchtitan config {config!r} not found in module {module!r} ({detail})", flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
