"""The import structure holds (pyproject.toml's [tool.importlinter] contracts, checked by `lint-imports`): imports
only go down the layers, the supervisor and the ranks never import each other, and torch, torchtitan and
torch_npu stay in rank/, overrides/ and doctor/probe."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = [contract["id"] for contract in
             tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"
IMPORT = re.compile(r"(slurm_titan[\w.]*) -> ([\w.]+) \(l\.")
"""One import of a broken contract's report: `slurm_titan.node.finish -> slurm_titan.rank.progress (l.37)`."""

_NODE_RANK = {
    "slurm_titan.node.finish -> slurm_titan.rank.progress",  # the progress record moves to records/
    "slurm_titan.node.supervisor -> slurm_titan.rank.preemption",  # STOP_FILE_ENV moves to envvars.py
    "slurm_titan.rank.checkpointer -> slurm_titan.node.restore",  # wait_for_restore moves to rank/restore_gate.py
    "slurm_titan.rank.entry -> slurm_titan.node.stacks",
}
PENDING: dict[str, set[str]] = {
    "layers": _NODE_RANK | {
        "slurm_titan.node.restore -> slurm_titan.launch.plan",  # CheckpointPlan moves to node/spec.py
        "slurm_titan.node.supervisor -> slurm_titan.launch.plan",  # NodeSpec moves to node/spec.py
    },
    "node-rank": _NODE_RANK,
    "no-torch": {
        # the supervisor reaches rank.preemption (torch inside agreed_stop) until STOP_FILE_ENV is in envvars.py:
        "slurm_titan.node.supervisor -> slurm_titan.rank.preemption",
        "slurm_titan.rank.preemption -> torch",
        "slurm_titan.rank.preemption -> torchtitan",
        "slurm_titan.launch.submit -> slurm_titan.node.supervisor",
        "slurm_titan.cli.main -> slurm_titan.launch.submit",
    },
}
"""Imports that break a contract until the other moves of issue 12 land (the node/rank split, the checkpoint
library's torch-free core): each entry goes when its import does, and the test says which are gone."""


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract: str) -> None:
    result = subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--contract", contract, "--no-cache"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, env=os.environ | {"COLUMNS": "500"})
    broken = {f"{importer} -> {imported}" for importer, imported in IMPORT.findall(result.stdout)}
    pending = PENDING.get(contract, set())
    assert broken - pending == set(), result.stdout
    assert pending - broken == set(), f"fixed: remove them from PENDING[{contract!r}]"
    assert result.returncode == (1 if pending else 0), result.stdout + result.stderr
