"""The preflight of a job: every node reports through the job folder, node 0 judges, every node obeys.

Files (shared filesystem, each written whole then renamed into place): `<job_dir>/doctor/attempt-A/node-N.json`
(node N's facts and own findings), `.../reach-N.json` (jobs of several nodes whose NPUs have hccn_tool facts:
node N's ping from one of its NPUs to one NPU of node N+1 mod the node count, a ring, so that every node is
pinged once whatever the node count) and `.../verdict.json` (node 0's list of findings, from every report plus
the cross-node comparison). Node 0 waits `timeout_s` after its own report for the others (a missing one is a
failure); the others wait `timeout_s + VERDICT_GRACE_S` for the verdict. The preflight fails on a failure;
warnings are returned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurm_titan.doctor.checks import compare_nodes, node_findings, ping_pair, reachability
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.facts import FactError, NodeFacts, collect_facts, ping_device
from slurm_titan.doctor.report import Finding, PreflightFailed, failures
from slurm_titan.records.polls import poll_waits
from slurm_titan.records.run_folder import doctor_folder
from slurm_titan.records.whole_file import replace_text

DEFAULT_TIMEOUT_S = 600.0
VERDICT_GRACE_S = 120.0
POLL_S = 0.2
MAX_POLL_S = 1.0
"""The waits' first and longest polls (spread, and never more often than the job folder's listing budget at the node
count allows: :func:`slurm_titan.records.polls.poll_waits`); a restart waits for the verdict on its critical path."""
VERDICT = "verdict.json"
Collector = Callable[[DoctorExpectations, int], NodeFacts]
Pinger = Callable[[str, str, str], tuple[int, int]]
"""(ascend home, own hccn_tool device id, peer device IP) -> (packets sent, received); FactError if it cannot run."""


def _write_json(path: Path, data: dict[str, Any]) -> None:
    replace_text(path, json.dumps(data, indent=1, sort_keys=True))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_json(path: Path, deadline: float, num_nodes: int) -> dict[str, Any] | None:
    waits = poll_waits(num_nodes, POLL_S, MAX_POLL_S)
    while (data := _read_json(path)) is None and time.monotonic() < deadline:
        time.sleep(next(waits))
    return data


def _findings(rows: list[dict[str, str]]) -> list[Finding]:
    return [Finding(**row) for row in rows]


def _pings(report: dict[str, Any], num_nodes: int) -> bool:
    """Whether this node's report promises a reach-N.json."""
    return num_nodes > 1 and bool(report["facts"].get("network"))


def judge(folder: Path, num_nodes: int, deadline: float, timeout_s: float) -> list[Finding]:
    """Node 0: wait until `deadline` for every node's report (and ping), then every finding of the job (own
    checks, pings, comparison, silence)."""
    reports: dict[int, dict[str, Any]] = {}
    reach: dict[int, dict[str, Any]] = {}
    waits = poll_waits(num_nodes, POLL_S, MAX_POLL_S)
    while True:
        for rank in range(num_nodes):
            if rank not in reports and (report := _read_json(folder / f"node-{rank}.json")) is not None:
                reports[rank] = report
            if rank in reports and rank not in reach and _pings(reports[rank], num_nodes) and \
                    (ping := _read_json(folder / f"reach-{rank}.json")) is not None:
                reach[rank] = ping
        waiting = len(reports) < num_nodes or any(_pings(report, num_nodes) and rank not in reach
                                                  for rank, report in reports.items())
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(next(waits))
    findings = [finding for rank in sorted(reports) for finding in _findings(reports[rank]["findings"])]
    findings += [finding for rank in sorted(reach) for finding in _findings(reach[rank]["findings"])]
    findings += compare_nodes([NodeFacts.from_json(report["facts"]) for report in reports.values()])
    findings += [Finding(str(rank), "preflight", f"no report within {timeout_s:.0f} s", f"{folder}/node-{rank}.json")
                 for rank in range(num_nodes) if rank not in reports]
    findings += [Finding(str(rank), "device reachability", f"no ping result within {timeout_s:.0f} s",
                         f"{folder}/reach-{rank}.json")
                 for rank, report in sorted(reports.items()) if _pings(report, num_nodes) and rank not in reach]
    return findings


def _reach(folder: Path, facts: NodeFacts, num_nodes: int, expect: DoctorExpectations, deadline: float,
           ping: Pinger) -> list[Finding]:
    """This node's ping of the next node's NPU (nothing when that node stays silent: judged as silence)."""
    peer_report = _wait_json(folder / f"node-{(facts.node_rank + 1) % num_nodes}.json", deadline, num_nodes)
    if peer_report is None:
        return []
    peer = NodeFacts.from_json(peer_report["facts"])
    pair = ping_pair(facts, peer)
    if pair is None:
        return []
    try:
        outcome: tuple[int, int] | str = ping(expect.ascend_home, *pair)
    except (FactError, OSError, ValueError) as error:
        outcome = str(error)
    return reachability(facts, peer, *pair, outcome)


def read_verdict(job_dir: Path, attempt: int) -> list[Finding] | None:
    """Node 0's verdict on an attempt's preflight (every finding of the job), None when it wrote none."""
    verdict = _read_json(doctor_folder(job_dir, attempt) / VERDICT)
    return None if verdict is None else _findings(verdict["findings"])


def run_preflight(job_dir: Path, attempt: int, node_rank: int, num_nodes: int, expect: DoctorExpectations,
                  timeout_s: float = DEFAULT_TIMEOUT_S, *, collect: Collector = collect_facts,
                  ping: Pinger = ping_device) -> list[Finding]:
    """Run this node's part of the job's preflight and return the job's warnings; PreflightFailed (the same
    table on every node) if any node failed a check, the nodes differ, or a node or the verdict stayed silent
    past the timeout."""
    folder = doctor_folder(job_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    facts = collect(expect, node_rank)
    _write_json(folder / f"node-{node_rank}.json", {"facts": facts.to_json(), "findings": [
        asdict(f) for f in node_findings(facts, expect, num_nodes)]})
    deadline = time.monotonic() + timeout_s
    if num_nodes > 1 and facts.network:
        _write_json(folder / f"reach-{node_rank}.json", {"findings": [
            asdict(f) for f in _reach(folder, facts, num_nodes, expect, deadline, ping)]})
    if node_rank == 0:
        findings = judge(folder, num_nodes, deadline, timeout_s)
        _write_json(folder / VERDICT, {"nodes": num_nodes, "findings": [asdict(f) for f in findings]})
    elif (verdict := _wait_json(folder / VERDICT, deadline + VERDICT_GRACE_S, num_nodes)) is not None:
        findings = _findings(verdict["findings"])
    else:
        waited = timeout_s + VERDICT_GRACE_S
        findings = [Finding(facts.label, "preflight", f"no verdict from node 0 within {waited:.0f} s",
                            str(folder / VERDICT))]
    if failures(findings):
        raise PreflightFailed(findings, num_nodes)
    return findings
