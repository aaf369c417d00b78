"""The plan: a golden file pins the sbatch script submitit generates and the per-node command."""

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import flatten_options, plan_job
from slurm_titan.node.batch_spec import BatchSpec, RetryPolicy
from slurm_titan.node.straggler_config import StragglerPlan
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


def test_the_batch_spec_carries_the_config(tmp_path: Path) -> None:
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path), [
        ("slurm.nodes", 4), ("slurm.spare_nodes", 1), ("preemption.allow_shrink", True),
        ("preemption.max_failures", 7), ("torchtitan.config", "llama3_8b")]))
    assert plan.batch == BatchSpec(nodes=4, shrink_to=(3, 2, 1), retry=RetryPolicy(
        max_requeues=20, max_failures=7, max_failures_without_progress=3), signal_seconds=120, titan_module="llama3",
        titan_config="llama3_8b", straggler=StragglerPlan(action="swap", threshold=0.8, window_steps=None,
                                                          warmup_steps=5, total_steps=12))
    assert "#SBATCH --nodes=5" in plan.script()  # the allocation has the spare; each attempt, the spec's count


def test_the_batch_script_writes_its_spec_and_hands_every_process_the_job_folder(tmp_path: Path) -> None:
    """The sbatch script of a plan, run by bash with stand-ins for srun and the Python (they log their arguments):
    its set-up writes the plan's batch spec into the job's folder, `{job_id}` filled in from SLURM_JOB_ID, and
    every process of the batch shell gets that folder."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name in ("python", "srun"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
        (bin_dir / name).chmod(0o755)
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path), [
        ("runs_dir", str(tmp_path / "my runs")), ("environment.python", str(bin_dir / "python")),
        ("environment.workdir", str(tmp_path))]))
    (tmp_path / "job.sh").write_text(plan.script())
    subprocess.run(["bash", str(tmp_path / "job.sh")], check=True, timeout=60,
                   env=os.environ | {"SLURM_JOB_ID": "77", "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    job_dir = tmp_path / "my runs/debug-cpu/77"
    assert BatchSpec.load(job_dir) == plan.batch
    deadline = time.monotonic() + 10
    while len(calls.read_text().splitlines()) < 5 and time.monotonic() < deadline:  # step_watch runs in background
        time.sleep(0.05)
    made = sorted(line.split(" --shell-pid ")[0] for line in calls.read_text().splitlines() if "slurm_titan" in line)
    assert made == [f"python -m slurm_titan.node.batch.{module} --job-dir {job_dir}{extra}" for module, extra in
                    [("allocation", ""), ("finish", " --srun-exit-code 0"), ("step_watch", ""), ("titan_check", "")]]


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


def test_the_upload_rate_reaches_every_rank_and_zero_leaves_the_uploads_unpaced(tmp_path: Path) -> None:
    config = pinned_debug_cpu(tmp_path)
    default = plan_job(load_config(config)).node.checkpoint
    assert default is not None and default.rank_env("77")["SLURM_TITAN_CKPT_UPLOAD_RATE"] == "3500"
    unpaced = plan_job(load_config(config, [("checkpoint.upload_rate", 0)])).node.checkpoint
    assert unpaced is not None and "SLURM_TITAN_CKPT_UPLOAD_RATE" not in unpaced.rank_env("77")


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
