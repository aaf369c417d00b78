"""What the batch shell judged of the nodes' speed: every node's score over time, and the node named slow.

`attempts/<A>/node-scores.jsonl`: one line per judgment (time, step, each host's score: the median of the
other nodes' working time per step over its own; 1 is typical, 0.6 a node working 1/0.6 as long for the
same step). `attempts/<A>/slow-node.json`: the node named slow in that attempt and what was done (`swap`: the
attempt ends with a checkpoint and the next one runs without it; `alert`: training goes on). Written by
node.batch.straggler; read by node.batch.finish (a swap restarts without counting a failure), `status` and
the report.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan.records import run_folder
from slurm_titan.records.whole_file import replace_text

SWAP, ALERT, OFF = "swap", "alert", "off"
HOST, DEVICE = "host", "device"  # what named the node: its ranks' wanted CPU time, or its chips' probe


@dataclass(frozen=True, kw_only=True)
class SlowNode:
    """A node named slow: its score over the window that named it, and the action taken (with why)."""

    host: str
    node: int
    score: float
    step: int  # the step at which it was named
    since_step: int  # the first step of the window it stayed below the threshold in
    time: float
    action: str  # SWAP | ALERT
    why: str  # the swap's gain and cost, or why it only alerts
    signal: str = HOST  # HOST or DEVICE

    def describe(self) -> str:
        chip = ", its chips' probe time" if self.signal == DEVICE else ""
        return (f"slow node {self.host} (score {self.score:.2f} of the other nodes' median over steps "
                f"{self.since_step}..{self.step}{chip})")


@dataclass(frozen=True)
class ScoreLine:
    """One judgment: each host's score at `time`, at `step`."""

    attempt: int
    time: float
    step: int
    scores: dict[str, float]


def write_verdict(job_dir: Path, attempt: int, slow: SlowNode) -> None:
    replace_text(run_folder.slow_node(job_dir, attempt), json.dumps(asdict(slow), indent=1))


def read_verdict(job_dir: Path, attempt: int) -> SlowNode | None:
    """The attempt's slow node, None when none was named (or the file does not parse)."""
    try:
        return SlowNode(**json.loads(run_folder.slow_node(job_dir, attempt).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def append_scores(job_dir: Path, attempt: int, line: ScoreLine) -> None:
    """One judgment, one line (one write)."""
    path = run_folder.node_scores(job_dir, attempt)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"time": round(line.time, 3), "step": line.step,
                              "scores": {host: round(score, 4) for host, score in line.scores.items()}}) + "\n")


def read_scores(job_dir: Path) -> list[ScoreLine]:
    """Every attempt's judgments, in order; lines that do not parse are skipped."""
    out = []
    for attempt in run_folder.attempt_numbers(job_dir):
        try:
            text = run_folder.node_scores(job_dir, attempt).read_text(encoding="utf-8")
        except OSError:
            continue
        for raw in text.splitlines():
            try:
                data = json.loads(raw)
                out.append(ScoreLine(attempt, float(data["time"]), int(data["step"]),
                                     {str(h): float(s) for h, s in data["scores"].items()}))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return out
