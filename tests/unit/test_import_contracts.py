"""The import structure holds (pyproject.toml's [tool.importlinter] contracts, checked by `lint-imports`): imports
only go down the layers, the supervisor and the ranks never import each other, and torch, torchtitan and
torch_npu stay in rank/, overrides/ and doctor/probe_main. `lint-imports` runs once for every contract (with its
cache); each contract is judged by its own line of the report."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = {contract["id"]: contract["name"] for contract in
             tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


@pytest.fixture(scope="module")
def report() -> str:
    result = subprocess.run([sys.executable, "-c", LINT_IMPORTS], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env=os.environ | {"COLUMNS": "500"})
    return result.stdout + result.stderr


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract: str, report: str) -> None:
    verdicts = [line for line in report.splitlines() if line.startswith(CONTRACTS[contract] + " ")]
    assert len(verdicts) == 1 and " KEPT" in verdicts[0], report
