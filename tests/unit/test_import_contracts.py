"""The import structure holds (pyproject.toml's [tool.importlinter] contracts, checked by `lint-imports`): imports
only go down the layers, the supervisor and the ranks never import each other, and torch, torchtitan and
torch_npu stay in rank/, overrides/ and doctor/probe."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = [contract["id"] for contract in
             tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract: str) -> None:
    result = subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--contract", contract, "--no-cache"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, env=os.environ | {"COLUMNS": "500"})
    assert result.returncode == 0, result.stdout + result.stderr
