"""torchtitan hook: one metrics run per job (per run, for the jobs of a run), whatever the number of attempts.

torchtitan 0.3.0 (`components/metrics.py`, `MetricsProcessor._build_metric_logger`) writes
TensorBoard events to `<dump_folder>/<metrics.save_tb_folder>/<%Y%m%d-%H%M of the start>/`, so
every restart and requeue becomes a run of its own in TensorBoard, each with a piece of the step
axis; no option changes that folder name. This override keeps torchtitan's loggers and puts
TensorBoard's events under `<dump_folder>/<save_tb_folder>/<run>/` instead (`replica_<R>/` and
`rank_<R>/` below it as torchtitan does), `<run>` being `$SLURM_JOB_NAME-$SLURM_JOB_ID`, the same
for every attempt of the job (a requeued job keeps its id). A job bound to a run (`submit --run`)
names it after the run instead ($SLURM_TITAN_RUN), and a later job of the run writes under the dump
folder of the run's first job ($SLURM_TITAN_RUN_DUMP_FOLDER, set by launch.plan): TensorBoard's
SummaryWriter adds an event file of its own to an existing folder, so the run's jobs are one run.
Every attempt resumes at the step after its checkpoint, so the events of all attempts share one step
axis; steps trained again after a failure appear twice there. W&B gets the same run id
(`WANDB_RUN_ID`, with `WANDB_RESUME=allow` so that later attempts continue the run) unless the job's
environment sets them.

Activated by the plan (``--override.imports slurm_titan.overrides.titan_metrics.continuous_metrics``)
when `metrics.enable_tensorboard` or `metrics.enable_wandb` is on. Imports torch: node side only.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torchtitan.components.metrics import (
    BaseLogger,
    LoggerContainer,
    MetricsProcessor,
    TensorBoardLogger,
    _get_metrics_rank,
)
from torchtitan.config import derive, override

from slurm_titan import envvars


def run_name(env: Mapping[str, str] = os.environ) -> str:
    """The job's run ($SLURM_TITAN_RUN), else `<job name>-<job id>` from Slurm's environment (`run` outside Slurm),
    safe as a folder name."""
    parts = [env[envvars.RUN]] if env.get(envvars.RUN) else [env.get("SLURM_JOB_NAME", ""), env.get("SLURM_JOB_ID", "")]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(p for p in parts if p)) or "run"


class ContinuousMetricsProcessor(MetricsProcessor):
    """torchtitan's MetricsProcessor with TensorBoard (and W&B) runs named after the job, not the start time."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def _build_metric_logger(self, *, config: MetricsProcessor.Config, parallel_dims: Any, dump_folder: str,
                             pp_schedule: str, ft_enable: bool = False, ft_replica_id: int = 0,
                             config_dict: dict[str, Any] | None = None, tag: str | None = None) -> BaseLogger:
        run = run_name()
        if config.enable_wandb:
            os.environ.setdefault("WANDB_RUN_ID", run)
            os.environ.setdefault("WANDB_RESUME", "allow")
        built = super()._build_metric_logger(
            config=dataclasses.replace(config, enable_tensorboard=False), parallel_dims=parallel_dims,
            dump_folder=dump_folder, pp_schedule=pp_schedule, ft_enable=ft_enable, ft_replica_id=ft_replica_id,
            config_dict=config_dict, tag=tag)
        if not config.enable_tensorboard:
            return built
        rank = dist.get_rank()
        if not config.save_for_all_ranks and rank != _get_metrics_rank(parallel_dims=parallel_dims,
                                                                        pp_schedule=pp_schedule):
            return built
        below = (([f"replica_{ft_replica_id}"] if ft_enable else [])
                 + ([f"rank_{rank}"] if config.save_for_all_ranks else []))
        container = built if isinstance(built, LoggerContainer) else LoggerContainer()
        folder = os.environ.get(envvars.RUN_DUMP_FOLDER) or dump_folder
        container.add_logger(TensorBoardLogger(os.path.join(folder, config.save_tb_folder, run, *below), tag))
        return container


@override(
    target=MetricsProcessor.Config,
    exact=True,
    description="slurm-titan: one TensorBoard / W&B run per job (or run) across restarts and requeues",
)
def continuous_metrics(cfg: MetricsProcessor.Config) -> ContinuousMetricsProcessor.Config:
    return derive(cfg, ContinuousMetricsProcessor.Config)
