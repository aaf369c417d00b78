"""Render the text templates of `slurm_titan/launch/templates/`."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from importlib import resources
from string import Template


def render(name: str, **values: str) -> str:
    """Substitute ``${key}`` placeholders of templates/<name>; a missing value is an error."""
    text = resources.files("slurm_titan.launch.templates").joinpath(name).read_text(encoding="utf-8")
    return Template(text).substitute(values)


def export_lines(env: Mapping[str, str]) -> str:
    """``export KEY=value`` lines, values shell-quoted, in a stable order."""
    return "\n".join(f"export {key}={shlex.quote(str(value))}" for key, value in sorted(env.items()))
