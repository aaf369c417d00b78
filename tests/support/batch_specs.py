"""A job folder's batch spec as the sbatch script writes it (what titan_check, allocation and finish read)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from slurm_titan.node.batch_spec import BatchSpec, RetryPolicy
from slurm_titan.node.straggler_config import StragglerPlan
from slurm_titan.records import run_folder

SPEC = BatchSpec(nodes=2, shrink_to=(), retry=RetryPolicy(max_requeues=5, max_failures=5,
                                                         max_failures_without_progress=3),
                 signal_seconds=60, titan_module="llama3", titan_config="llama3_debugmodel",
                 straggler=StragglerPlan(action="off", threshold=0.8, window_steps=None, warmup_steps=5,
                                         total_steps=None))


def write_batch_spec(job_dir: Path, **changes: Any) -> BatchSpec:
    """SPEC with `changes`, written into `job_dir`; returns it."""
    spec = replace(SPEC, **changes)
    job_dir.mkdir(parents=True, exist_ok=True)
    run_folder.batch_spec_file(job_dir).write_text(spec.to_json())
    return spec
