"""The plan: a golden file pins the sbatch script submitit generates and the per-node command."""

import os
from pathlib import Path

import pytest

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import flatten_options, plan_job
from tests.support.paths import DATA
from tests.support.plans import pinned_debug_cpu

GOLDEN = DATA / "golden/debug_cpu_plan.txt"


def test_plan_matches_golden_file(tmp_path: Path) -> None:
    text = str(plan_job(load_config(pinned_debug_cpu(tmp_path))))
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_plan_rank_command_runs_the_project_entry_with_overrides(tmp_path: Path) -> None:
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path)))
    argv = list(plan.node.rank_argv)
    assert argv[:4] == ["/opt/venv/bin/python", "-u", "-m", "slurm_titan.rank.entry"]
    assert argv[argv.index("--override.imports") + 1].startswith("slurm_titan.overrides.")
    assert argv[-1] == "activation-checkpoint:none"
    job_dir, resolved = plan.node.resolve("77")
    assert job_dir == Path("/shared/runs/debug-cpu/77")
    assert "/shared/runs/debug-cpu/77/dump" in resolved


def test_nodes_flag_reaches_sbatch(tmp_path: Path) -> None:
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path), [("slurm.nodes", 4), ("slurm.partition", "high")]))
    script = plan.script()
    assert "#SBATCH --nodes=4" in script
    assert "#SBATCH --partition=high" in script
    assert "#SBATCH --ntasks-per-node=1" in script


def test_flatten_options_speaks_tyro() -> None:
    assert flatten_options({"training": {"steps": 3, "local_batch_size": 2}, "validator": {"enable": False},
                            "compile": {"enable": True}, "x": {"l": [1, 2]}}) == [
        "--training.steps", "3", "--training.local-batch-size", "2", "--validator.no-enable",
        "--compile.enable", "--x.l", "1", "2"]


def test_unknown_torchtitan_config_caught_before_submit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="torchtitan.config: torchtitan module 'llama3' has no config 'llama3_tiny'"):
        plan_job(load_config(pinned_debug_cpu(tmp_path), [("torchtitan.config", "llama3_tiny")]))


def test_missing_dataset_path_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="torchtitan.args.dataloader.dataset_path: /no/such: no such file"):
        plan_job(load_config(pinned_debug_cpu(tmp_path), [("torchtitan.args.dataloader.dataset_path", "/no/such")]))


def test_upload_cpus_reach_every_rank_and_are_left_out_when_unset(tmp_path: Path) -> None:
    config = pinned_debug_cpu(tmp_path)
    pinned = plan_job(load_config(config, [("checkpoint.upload_cpus", "1,3")])).node.checkpoint
    assert pinned is not None and pinned.rank_env("77")["SLURM_TITAN_CKPT_UPLOAD_CPUS"] == "1,3"
    default = plan_job(load_config(config)).node.checkpoint
    assert default is not None and "SLURM_TITAN_CKPT_UPLOAD_CPUS" not in default.rank_env("77")


NPU_JOB = """
name: npu-job
slurm: {nodes: 2, devices_per_node: 8}
environment: {device: npu, npu: {socket_ifname: [eth0]}}
"""


def npu_plan(tmp_path: Path, *sets: tuple[str, object]):
    path = tmp_path / "npu.yaml"
    path.write_text(NPU_JOB)
    return plan_job(load_config(path, list(sets)))


def test_npu_jobs_ask_slurm_for_their_devices(tmp_path: Path) -> None:
    assert "#SBATCH --gres=npu:8" in npu_plan(tmp_path).script()
    assert "--gres" not in npu_plan(tmp_path, ("slurm.gres", "none")).script()
    assert "#SBATCH --gres=npu:16" in npu_plan(tmp_path, ("slurm.gres", "npu:16")).script()
    assert "--gres" not in plan_job(load_config(pinned_debug_cpu(tmp_path))).script()


def test_npu_jobs_free_gradients_and_keep_compile_off(tmp_path: Path) -> None:
    argv = list(npu_plan(tmp_path).node.rank_argv)
    assert "--training.disable-cuda-graphs" in argv and "--compile.no-enable" in argv
    assert argv.index("--compile.no-enable") < argv.index("--override.imports")
    mine = list(npu_plan(tmp_path, ("torchtitan.args.training.disable_cuda_graphs", False)).node.rank_argv)
    assert "--training.no-disable-cuda-graphs" in mine and "--training.disable-cuda-graphs" not in mine
    cpu = list(plan_job(load_config(pinned_debug_cpu(tmp_path))).node.rank_argv)
    assert "--training.disable-cuda-graphs" not in cpu and "--compile.no-enable" not in cpu
