"""One TensorBoard run with one step axis across a job's attempts (slurm_titan.overrides.titan_metrics)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from torchtitan.components.metrics import MetricsProcessor

from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import METRICS_OVERRIDE, default_overrides
from slurm_titan.overrides.titan_metrics import ContinuousMetricsProcessor, continuous_metrics, run_name


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


@pytest.mark.parametrize(("metrics", "active"), [("{}", False), ("{enable_tensorboard: true}", True),
                                                 ("{enable_wandb: true}", True),
                                                 ("{enable_tensorboard: false}", False)])
def test_plan_activates_the_override_when_a_metrics_sink_is_on(tmp_path, metrics, active):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: x\nenvironment: {{device: cpu}}\ntorchtitan: {{args: {{metrics: {metrics}}}}}\n")
    assert (METRICS_OVERRIDE in default_overrides(load_config(path))) is active
