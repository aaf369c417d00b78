"""Each node's working time per step, told to the batch shell: one small JSON file per node and attempt.

The node supervisor sums its ranks' progress records (records.rank_progress: steps, the CPU time their
threads wanted in them, their wall time, their chips' probe time) and replaces
`attempts/<A>/timing/node-<N>.json` every few seconds
(node.supervisor.timing); the batch shell's step watcher reads every node's file (one listing of the folder)
and scores the nodes against each other (node.batch.straggler). The sums only grow within an attempt: a
reader takes differences between two readings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan.records import run_folder
from slurm_titan.records.rank_progress import Progress
from slurm_titan.records.whole_file import replace_text


@dataclass(frozen=True, kw_only=True)
class NodeTiming:
    """A node's ranks summed, at `time`."""

    node: int
    host: str
    time: float
    step: int  # the lowest step its ranks are in
    steps: int  # steps its ranks finished in this attempt, summed over the ranks
    work_s: float  # the CPU time they wanted in those steps (ran + waited for a CPU)
    wall_s: float  # their wall time
    device_s: float = 0.0  # the device time of their chips' probes (rank.device_probe; none on the CPU)
    probes: int = 0  # how many probes that is

    @classmethod
    def of(cls, node: int, host: str, records: dict[int, Progress], now: float) -> NodeTiming:
        """The sum of the node's ranks' records."""
        progress = list(records.values())
        return cls(node=node, host=host, time=now, step=min((p.step for p in progress), default=0),
                   steps=sum(p.steps_done for p in progress), work_s=sum(p.work_s for p in progress),
                   wall_s=sum(p.wall_s for p in progress), device_s=sum(p.device_s for p in progress),
                   probes=sum(p.probes for p in progress))


def write(job_dir: Path, attempt: int, timing: NodeTiming) -> None:
    """Replace the node's file at once (tmp + rename: a reader sees the old or the new)."""
    replace_text(run_folder.node_timing(job_dir, attempt, timing.node), json.dumps(asdict(timing)))


def read_all(job_dir: Path, attempt: int) -> dict[int, NodeTiming]:
    """Every node's last timing of the attempt (one listing of the folder); unreadable files are left out."""
    folder = run_folder.timing_folder(job_dir, attempt)
    timings = {}
    for node in run_folder.node_files(folder):
        try:
            timings[node] = NodeTiming(**json.loads((folder / f"node-{node}.json").read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return timings

