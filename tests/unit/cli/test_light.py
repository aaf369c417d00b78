"""The login-node commands stay light: no torch, no torchtitan, fast."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import PROBE
from tests.support.paths import REPO


@pytest.mark.parametrize("args", [["--help"], ["submit", "configs/debug_cpu.yaml", "--dry-run"],
                                  ["data", "prepare", "--help"]])
def test_cli_commands_import_no_torch(args: list[str]) -> None:
    """What a command really loads. The no-torch import contract (tests/test_import_contracts.py) covers every
    import of cli/ and what it reaches; a dry run also looks torchtitan up (importlib.util.find_spec) and must
    not load tokenizers (launch.debug_assets, for submitting only), which no import graph shows."""
    result = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert "HEAVY: \n" in result.stderr, result.stderr


def test_dry_run_prints_script_and_submits_nothing(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", "submit", "configs/debug_cpu.yaml",
                             "--nodes", "3", "--dry-run", "--set", f"runs_dir={tmp_path}"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=3" in result.stdout
    assert "slurm_titan.rank.entry" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_config_error_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nslurm: {nodes: 0}\n")
    result = subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", "submit", str(bad)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == f"slurm-titan: {bad}: slurm.nodes: must be >= 1, got 0\n"


def test_a_bad_straggler_threshold_is_one_line_exit_2_and_nothing_submitted(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: x\nruns_dir: {tmp_path / 'runs'}\ncheckpoint: {{enable: true}}\n"
                   "straggler: {threshold: 1.2}\n")
    result = subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", "submit", str(bad)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == f"slurm-titan: {bad}: straggler.threshold: must be within (0, 1), got 1.2\n"
    assert not (tmp_path / "runs").exists()
