"""configs/debug_cpu.yaml with the machine-dependent paths pinned: the config behind the golden plan."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.paths import REPO

PINNED = """
runs_dir: /shared/runs
environment:
  python: /opt/venv/bin/python
  workdir: /shared/work
torchtitan:
  debug_assets: /shared/assets
"""


def pinned_debug_cpu(tmp_path: Path) -> Path:
    """configs/debug_cpu.yaml with the machine-dependent paths pinned."""
    data = yaml.safe_load((REPO / "configs/debug_cpu.yaml").read_text())
    for section, values in yaml.safe_load(PINNED).items():
        data[section] = data.get(section, {}) | values if isinstance(values, dict) else values
    path = tmp_path / "debug_cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
