"""Hang attribution across nodes with one node's clock off, for the scale harness's Slurm part (:mod:`.slurm`).

Every node of the attempt is the real watchdog (:class:`~slurm_titan.node.supervisor.watchdog.Watchdog`) over its
8 ranks: their progress records as the ranks write them, stamped with the node's own clock; it finds them late
(``overdue``), names its culprit (``first_view``: the records and the ranks' process states; ``investigate``: also
their stacks, by py-spy) and that view goes into the node's report; the batch shell's attribution
(:func:`~slurm_titan.node.batch.attribution.first_failure`) picks the culprit among the reports. A rank is one of
two real sleeping processes: the stuck one in a data loader's function, its peers in a collective's (a function of
a file named distributed_c10d.py). The hang lies 1,000 s ahead of now, after every watchdog's arming.

Kinds of hang, every rank in step 100 for 60 s when the watchdogs fire (step budget 45 s):

- ``stacks``: the stuck rank waits outside any collective, the others in one; the views with stacks;
- ``steps``: the stuck rank never finished step 99, its peers did; the views without stacks;
- ``tie``: the stuck rank's last progress 1 s older than its peers' in the same step; the views without stacks
  (only their ``since`` tells them apart: compared on the batch shell's clock, each report sighted by its step
  watcher when written, 0 to ``step_watch.SIGHT_POLL_S`` late, as its listing thread sees it).

Each kind with no clock off, then another node's clock 5 s behind and ahead, then the stuck node's.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slurm_titan.errors import ExitCode
from slurm_titan.node.batch import attribution, step_watch
from slurm_titan.node.budgets import Budgets, WatchdogSpec
from slurm_titan.node.supervisor.watchdog import Hang, Watchdog
from slurm_titan.records import rank_progress, run_folder
from slurm_titan.records.rank_progress import Phase, Progress

RANKS_PER_NODE = 8
ATTEMPT = 0
STEP = 100
STALLED_S = 60.0
SLOWEST_STEP_S = 10.0
TIE_S = 1.0
SKEW_S = 5.0
AHEAD_S = 1000.0
KINDS = ("stacks", "steps", "tie")
BUDGETS = Budgets.from_spec(WatchdogSpec(), collective_s=600)
STUCK, WAITING = "data_loader", "distributed_c10d"
FRAMES = {STUCK: "next_batch", WAITING: "all_reduce"}


@dataclass(frozen=True)
class Case:
    """A kind of hang and whose clock is off: `skewed` is "other" (the next node's), "culprit" or ""."""

    kind: str
    skewed: str = ""
    offset_s: float = 0.0

    def offset(self, node: int, stuck_node: int, nodes: int) -> float:
        """Node `node`'s clock minus the true time."""
        chosen = {"culprit": stuck_node, "other": (stuck_node + 1) % nodes}.get(self.skewed)
        return self.offset_s if node == chosen else 0.0


CASES = tuple(Case(kind, skewed, offset) for kind in KINDS for skewed, offset in
              (("", 0.0), ("other", -SKEW_S), ("other", SKEW_S), ("culprit", -SKEW_S), ("culprit", SKEW_S)))


def host_names(nodes: int) -> list[str]:
    return [f"n{node:04d}" for node in range(nodes)]


def node_report(job_dir: Path, node: int, host: str, code: int, failure: dict | None = None,
                hang: dict | None = None, first_written: float | None = None) -> None:
    """Node `node`'s report of the attempt, with the fields the node supervisor writes (tmp + rename)."""
    path = run_folder.node_report(job_dir, ATTEMPT, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    ranks = {str(rank): code for rank in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"host": host, "exit_code": code, "ranks": ranks, "first_failure": failure,
                               "hang": hang, "first_written": first_written}))
    tmp.replace(path)


@contextmanager
def rank_processes(folder: Path) -> Iterator[dict[str, int]]:
    """The two sleeping rank processes, each once in its function: module name -> pid."""
    folder.mkdir(parents=True, exist_ok=True)
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for module, function in FRAMES.items():
            (folder / f"{module}.py").write_text(
                f"import time\n\n\ndef {function}():\n    print('ready', flush=True)\n    time.sleep(3600)\n")
            process = started[module] = subprocess.Popen(
                [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); import {module}; "
                                             f"{module}.{function}()"], stdout=subprocess.PIPE, text=True)
            assert process.stdout is not None
            process.stdout.readline()  # in its function
        yield {module: process.pid for module, process in started.items()}
    finally:
        for process in started.values():
            process.kill()
            process.wait()


def _progress(kind: str, stuck: bool, entered: float) -> Progress:
    """A rank's record when its node's watchdog looks: in step STEP since `entered` (its node's clock)."""
    if stuck and kind == "steps":
        return Progress(Phase.STEP, STEP - 1, entered - SLOWEST_STEP_S, STEP - 2, SLOWEST_STEP_S)
    since = entered - TIE_S if stuck and kind == "tie" else entered
    return Progress(Phase.STEP, STEP, since, STEP - 1, SLOWEST_STEP_S)


def _view(job_dir: Path, node: int, nodes: int, kind: str, stuck: int, pids: dict[str, int],
          entered: float) -> Hang | None:
    """Node `node`'s watchdog's view of the hang (None when it finds no rank late), its clock `entered` when the
    ranks entered step STEP."""
    ranks = list(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE))
    watchdog = Watchdog(BUDGETS, ranks, job_dir, ATTEMPT, learns=node == 0, say=lambda text: None, node=node,
                        nodes=nodes)
    try:
        watchdog.arm()
        for rank, path in watchdog.records.items():
            path.write_bytes(rank_progress.encode(_progress(kind, rank == stuck, entered), 1))
        running = {rank: pids[STUCK if rank == stuck else WAITING] for rank in ranks}
        now = entered + STALLED_S
        if not watchdog.overdue(running, now):
            return None
        return watchdog.investigate(running, now) if kind == "stacks" else watchdog.first_view(running, now)
    finally:
        watchdog.close()


def named(workdir: Path, nodes: int, case: Case, pids: dict[str, int]) -> bool:
    """Whether the attribution names the stuck rank (rank 3 of node nodes // 2) over the nodes' reports."""
    job_dir = workdir / f"{case.kind}-{case.skewed or 'synced'}{case.offset_s:+g}"
    stuck_node = nodes // 2
    stuck, hosts = stuck_node * RANKS_PER_NODE + 3, host_names(nodes)
    run_folder.attempt_folder(job_dir, ATTEMPT).mkdir(parents=True)
    entered = time.time() + AHEAD_S
    sightings = {}
    for node in range(nodes):
        offset = case.offset(node, stuck_node, nodes)
        if hang := _view(job_dir, node, nodes, case.kind, stuck, pids, entered + offset):
            node_report(job_dir, node, hosts[node], ExitCode.HANG, hang=hang.as_dict(), first_written=hang.time)
            sightings[node] = hang.time - offset + random.uniform(0, step_watch.SIGHT_POLL_S)
    failure = attribution.first_failure(attribution.read_reports(job_dir, ATTEMPT, nodes), hosts, set(),
                                        sightings=sightings)
    return failure is not None and failure.kind == attribution.HUNG and failure.rank == stuck


def figures(workdir: Path, nodes: int) -> dict[str, float]:
    """culprit_right_<kind>: 1 when every case of the kind names the stuck rank; culprit_right: every kind."""
    with rank_processes(workdir / "frames") as pids:
        right = {case: named(workdir, nodes, case, pids) for case in CASES}
    kinds = {f"culprit_right_{kind}": float(all(ok for case, ok in right.items() if case.kind == kind))
             for kind in KINDS}
    return {"culprit_right": min(kinds.values())} | kinds
