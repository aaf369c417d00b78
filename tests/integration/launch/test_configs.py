"""The shipped NPU configs (Atlas 800T A2, Atlas A3): each passes `submit --dry-run`, and torchtitan 0.3.0 accepts
its options, including those the plan adds for NPU jobs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO

NPU_CONFIGS = ["configs/llama3_8b_npu_1node.yaml", "configs/llama3_8b_npu.yaml", "configs/llama3_70b_npu.yaml",
               "configs/llama3_8b_npu_a3.yaml"]
DEVICES = {"configs/llama3_8b_npu_a3.yaml": 16}
PARSE = """
import json, sys
from torchtitan.config import ConfigManager
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
seen = {}
for path in sys.argv[1:]:
    _, argv = plan_job(load_config(path)).node.resolve("1")
    config = ConfigManager().parse_args(argv[4:])
    seen[path] = {"ac": type(config.activation_checkpoint).__qualname__,
                  "tp": config.parallelism.tensor_parallel_degree,
                  "lr": config.optimizer.param_groups[0].optimizer_kwargs["lr"],
                  "warmup": config.lr_scheduler.warmup_steps, "global": config.training.global_batch_size,
                  "local": config.training.local_batch_size,
                  "timeouts": [config.comm.init_timeout_seconds, config.comm.train_timeout_seconds],
                  "npu": [config.training.disable_cuda_graphs, config.compile.enable]}
print(json.dumps(seen))
"""


@pytest.mark.parametrize("path", NPU_CONFIGS)
def test_dry_run(path: str) -> None:
    done = subprocess.run([sys.executable, "-m", "slurm_titan.cli.main", "submit", path, "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "export SLURM_TITAN_DEVICE=npu" in done.stdout and "export HCCL_HOST_SOCKET_PORT_RANGE=" in done.stdout
    assert "--module llama3" in done.stdout
    assert f"#SBATCH --gres=npu:{DEVICES.get(path, 8)}\n" in done.stdout
    assert "export HCCL_IF_BASE_PORT=" in done.stdout and "slurm-titan-cann" in done.stdout


def test_the_a3_config_says_its_attention_is_unverified() -> None:
    header = (REPO / "configs/llama3_8b_npu_a3.yaml").read_text().split("\nname:")[0]
    assert "UNVERIFIED ON A3" in header and "Atlas A2" in header and "Ascend 950" in header


def test_torchtitan_accepts_every_option() -> None:
    done = subprocess.run([sys.executable, "-c", PARSE, *NPU_CONFIGS], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    npu = {"timeouts": [1790, 1200], "npu": [True, False]}
    assert seen["configs/llama3_8b_npu_1node.yaml"] == seen["configs/llama3_8b_npu.yaml"] == \
        seen["configs/llama3_8b_npu_a3.yaml"] == {
            "ac": "SelectiveAC.Config", "tp": 1, "lr": 3e-4, "warmup": 200, "global": 128, "local": 1} | npu
    assert seen["configs/llama3_70b_npu.yaml"] == {
        "ac": "FullAC.Config", "tp": 8, "lr": 1.5e-4, "warmup": 200, "global": 64, "local": 2} | npu
