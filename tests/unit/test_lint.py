"""ruff and mypy pass with pyproject.toml's settings ([tool.ruff], [tool.mypy]), so .ci/run enforces them."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {
    "ruff": ["-m", "ruff", "check", "--output-format", "concise", "--quiet", "slurm_titan", "tests", "tools"],
    "mypy": ["-m", "mypy", "slurm_titan"],
}


@pytest.mark.parametrize("tool", COMMANDS)
def test_lint_passes(tool: str) -> None:
    result = subprocess.run([sys.executable, *COMMANDS[tool]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
