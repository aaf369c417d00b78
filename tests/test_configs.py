"""The shipped Atlas 800T A2 configs: each passes `submit --dry-run`, and torchtitan 0.3.0 accepts its options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NPU_CONFIGS = ["configs/llama3_8b_npu_1node.yaml", "configs/llama3_8b_npu.yaml", "configs/llama3_70b_npu.yaml"]
PARSE = """
import json, sys
from torchtitan.config import ConfigManager
from slurm_titan.config import load_config
from slurm_titan.plan import plan_job
seen = {}
for path in sys.argv[1:]:
    _, argv = plan_job(load_config(path)).node.resolve("1")
    config = ConfigManager().parse_args(argv[4:])
    seen[path] = {"ac": type(config.activation_checkpoint).__qualname__,
                  "tp": config.parallelism.tensor_parallel_degree,
                  "lr": config.optimizer.param_groups[0].optimizer_kwargs["lr"],
                  "warmup": config.lr_scheduler.warmup_steps, "global": config.training.global_batch_size,
                  "local": config.training.local_batch_size}
print(json.dumps(seen))
"""


@pytest.mark.parametrize("path", NPU_CONFIGS)
def test_dry_run(path: str) -> None:
    done = subprocess.run([sys.executable, "-m", "slurm_titan.cli", "submit", path, "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "export SLURM_TITAN_DEVICE=npu" in done.stdout and "export HCCL_HOST_SOCKET_PORT_RANGE=" in done.stdout
    assert "--module llama3" in done.stdout


def test_torchtitan_accepts_every_option() -> None:
    done = subprocess.run([sys.executable, "-c", PARSE, *NPU_CONFIGS], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["configs/llama3_8b_npu_1node.yaml"] == seen["configs/llama3_8b_npu.yaml"] == {
        "ac": "SelectiveAC.Config", "tp": 1, "lr": 3e-4, "warmup": 200, "global": 128, "local": 1}
    assert seen["configs/llama3_70b_npu.yaml"] == {
        "ac": "FullAC.Config", "tp": 8, "lr": 1.5e-4, "warmup": 200, "global": 64, "local": 2}
