"""Where the repository and the tests' recordings are, and how a child Python imports this checkout."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def repo_pythonpath(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the repository first on PYTHONPATH: what a child Python needs to
    import slurm_titan and tests.support from this checkout, whatever its working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env
