"""One TensorBoard run with one step axis across a job's attempts, and across a run's jobs
(slurm_titan.overrides.titan_metrics)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from torchtitan.components.metrics import MetricsProcessor

from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import METRICS_OVERRIDE, default_overrides, run_env
from slurm_titan.overrides.titan_metrics import ContinuousMetricsProcessor, continuous_metrics, run_name
from slurm_titan.records import jobs, run_registry


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _attempt(dump: Path, steps: range, config: MetricsProcessor.Config, processor: type) -> None:
    """What one attempt's rank 0 logs: the loggers torchtitan builds at start, then a loss per step."""
    logger = processor._build_metric_logger(object.__new__(processor), config=config, dump_folder=str(dump),
                                            parallel_dims=SimpleNamespace(pp_enabled=False), pp_schedule="1F1B")
    for step in steps:
        logger.log({"loss_metrics/global_avg_loss": 10.0 / step}, step)
    logger.close()


def _runs(tb: Path) -> dict[str, list[int]]:
    events = EventMultiplexer().AddRunsFromDirectory(str(tb))
    events.Reload()
    return {run: [e.step for e in events.Scalars(run, "loss_metrics/global_avg_loss")] for run in events.Runs()}


def test_attempts_of_a_job_write_one_tensorboard_run(tmp_path, monkeypatch, one_rank):
    monkeypatch.setenv("SLURM_JOB_NAME", "llama3-8b")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    config = continuous_metrics(MetricsProcessor.Config(enable_tensorboard=True, log_freq=1))
    assert isinstance(config, ContinuousMetricsProcessor.Config) and config.log_freq == 1
    _attempt(tmp_path, range(1, 6), config, ContinuousMetricsProcessor)  # preempted after step 5
    _attempt(tmp_path, range(6, 11), config, ContinuousMetricsProcessor)  # requeued, resumed from step 5
    assert _runs(tmp_path / "tb") == {"llama3-8b-4242": list(range(1, 11))}


def test_the_jobs_of_a_run_write_one_tensorboard_run_where_its_first_job_wrote(tmp_path, monkeypatch, one_rank):
    config = continuous_metrics(MetricsProcessor.Config(enable_tensorboard=True, log_freq=1))
    first, second = tmp_path / "llama3-8b/4242/dump", tmp_path / "llama3-8b-v2/4300/dump"
    monkeypatch.setenv("SLURM_TITAN_RUN", "exp-1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _attempt(first, range(1, 6), config, ContinuousMetricsProcessor)  # cancelled after step 5
    monkeypatch.setenv("SLURM_JOB_ID", "4300")  # the run's next job (another name), resumed from step 5
    monkeypatch.setenv("SLURM_TITAN_RUN_DUMP_FOLDER", str(first))
    _attempt(second, range(6, 11), config, ContinuousMetricsProcessor)
    assert _runs(first / "tb") == {"exp-1": list(range(1, 11))} and not second.exists()
    assert len(list((first / "tb/exp-1").glob("events.out.tfevents.*"))) == 2  # a file each, one folder


def test_plan_names_the_run_and_its_first_jobs_dump_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nenvironment: {device: cpu}\ntorchtitan: {args: {metrics: {enable_tensorboard: true}}}\n")
    config = load_config(path)
    assert run_env(config) == {}
    assert run_env(dataclasses.replace(config, run="exp-1")) == {"SLURM_TITAN_RUN": "exp-1"}  # its first job
    jobs.save(jobs.JobRecord("4242", "x", str(tmp_path / "runs/x/4242"), str(path), 1, 0.0, "exp-1", "s3://b/exp-1"))
    run_registry.create("exp-1", "s3://b/exp-1", None, "4242")
    assert run_env(dataclasses.replace(config, run="exp-1")) == {
        "SLURM_TITAN_RUN": "exp-1", "SLURM_TITAN_RUN_DUMP_FOLDER": str(tmp_path / "runs/x/4242/dump")}


def test_torchtitan_alone_writes_a_run_per_start_minute(tmp_path, monkeypatch, one_rank):
    """What the override fixes: torchtitan names the folder after the start time."""
    import torchtitan.components.metrics as metrics

    starts = iter(["20250101-1000", "20250101-1130"])
    clock = SimpleNamespace(now=lambda: SimpleNamespace(strftime=lambda f: next(starts)))
    monkeypatch.setattr(metrics, "datetime", clock)
    config = MetricsProcessor.Config(enable_tensorboard=True)
    _attempt(tmp_path, range(1, 6), config, MetricsProcessor)
    _attempt(tmp_path, range(6, 11), config, MetricsProcessor)
    assert _runs(tmp_path / "tb") == {"20250101-1000": [1, 2, 3, 4, 5], "20250101-1130": [6, 7, 8, 9, 10]}


def test_run_name_is_a_folder_name():
    assert run_name({"SLURM_JOB_NAME": "my run/x", "SLURM_JOB_ID": "7"}) == "my_run_x-7"
    assert run_name({}) == "run"
    assert run_name({"SLURM_TITAN_RUN": "exp-1", "SLURM_JOB_NAME": "x", "SLURM_JOB_ID": "7"}) == "exp-1"


@pytest.mark.parametrize(("metrics", "active"), [("{}", False), ("{enable_tensorboard: true}", True),
                                                 ("{enable_wandb: true}", True),
                                                 ("{enable_tensorboard: false}", False)])
def test_plan_activates_the_override_when_a_metrics_sink_is_on(tmp_path, metrics, active):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: x\nenvironment: {{device: cpu}}\ntorchtitan: {{args: {{metrics: {metrics}}}}}\n")
    assert (METRICS_OVERRIDE in default_overrides(load_config(path))) is active
