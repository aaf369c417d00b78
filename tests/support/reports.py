"""Node reports as a node's supervisor writes them at the end of an attempt (what attribution reads)."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_titan.records import run_folder


def node_report(job_dir: Path, attempt: int, node: int, host: str, code: int, failure: dict | None) -> None:
    path = run_folder.node_report(job_dir, attempt, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host, "exit_code": code, "ranks": {}, "first_failure": failure}))
