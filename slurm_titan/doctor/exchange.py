"""The preflight of a job: every node reports through the job folder, node 0 judges, every node obeys.

Files (shared filesystem, each written whole then renamed into place):
`<job_dir>/doctor/attempt-A/node-N.json` (node N's facts and own failures) and `.../verdict.json`
(node 0's list of failures, from every report plus the cross-node comparison). Node 0 waits `timeout_s`
for the reports (a missing one is a failure); the others wait `timeout_s + VERDICT_GRACE_S` for the verdict.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurm_titan.doctor.checks import compare_nodes, node_failures
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.facts import NodeFacts, collect_facts
from slurm_titan.doctor.report import Failure, PreflightFailed

DEFAULT_TIMEOUT_S = 600.0
VERDICT_GRACE_S = 120.0
POLL_S = 0.5
VERDICT = "verdict.json"
Collector = Callable[[DoctorExpectations, int], NodeFacts]


def attempt_dir(job_dir: Path, attempt: int) -> Path:
    return job_dir / "doctor" / f"attempt-{attempt}"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_json(path: Path, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while (data := _read_json(path)) is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return data


def judge(folder: Path, num_nodes: int, timeout_s: float) -> list[Failure]:
    """Node 0: wait for every node's report, then every failure of the job (own checks, comparison, silence)."""
    deadline = time.monotonic() + timeout_s
    reports: dict[int, dict[str, Any]] = {}
    while True:
        for rank in range(num_nodes):
            if rank not in reports and (report := _read_json(folder / f"node-{rank}.json")) is not None:
                reports[rank] = report
        if len(reports) == num_nodes or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    failures = [Failure(**row) for rank in sorted(reports) for row in reports[rank]["failures"]]
    failures += compare_nodes([NodeFacts.from_json(report["facts"]) for report in reports.values()])
    failures += [Failure(str(rank), "preflight", f"no report within {timeout_s:.0f} s", f"{folder}/node-{rank}.json")
                 for rank in range(num_nodes) if rank not in reports]
    return failures


def run_preflight(job_dir: Path, attempt: int, node_rank: int, num_nodes: int, expect: DoctorExpectations,
                  timeout_s: float = DEFAULT_TIMEOUT_S, *, collect: Collector = collect_facts) -> None:
    """Run this node's part of the job's preflight; PreflightFailed (the same table on every node) if any
    node failed a check, the nodes differ, or a node or the verdict stayed silent past the timeout."""
    folder = attempt_dir(job_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    facts = collect(expect, node_rank)
    _write_json(folder / f"node-{node_rank}.json",
                {"facts": facts.to_json(), "failures": [asdict(f) for f in node_failures(facts, expect)]})
    if node_rank == 0:
        failures = judge(folder, num_nodes, timeout_s)
        _write_json(folder / VERDICT, {"nodes": num_nodes, "failures": [asdict(f) for f in failures]})
    elif (verdict := _wait_json(folder / VERDICT, timeout_s + VERDICT_GRACE_S)) is not None:
        failures = [Failure(**row) for row in verdict["failures"]]
    else:
        waited = timeout_s + VERDICT_GRACE_S
        failures = [Failure(facts.label, "preflight", f"no verdict from node 0 within {waited:.0f} s",
                            str(folder / VERDICT))]
    if failures:
        raise PreflightFailed(failures, num_nodes)
