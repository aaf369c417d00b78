"""The job folder part of the scale harness: the project's own folder code at M = ranks / 8 simulated nodes, on a
file system that counts metadata operations and delays each by 20 ms, caches off (:mod:`tools.local_fs.slow_fs`).

    .venv/bin/python -m tools.bench.scale_sim.folder 64 128 256 512     # a row per rank count, then the goals
    .venv/bin/python -m tools.bench.scale_sim.folder --cache 1 64 512   # clients keep names, attributes 1 s
    .venv/bin/python -m tools.bench.scale_sim.folder --as-ranks 4096 512  # 64 nodes polling as 512 would
    .venv/bin/python -m tools.bench.scale_sim --parts folder

The job folder is ``<mount>/runs/sim/1``, each node with a mount of its own (a client: its kernel's locks are its
own), the batch shell with node 0's; a node is a thread of one of up to ``PROCESSES`` worker processes (they wait on
the file system, not on the CPU). Throughout, the batch shell's step watcher (``step_watch.watch``, heartbeat thread
and all, in a process of its own) watches the attempt's reports, as it does while the step runs; its stand-in for
srun (a ``sleep``) is ended after the rounds. Three rounds, each counted apart (the watcher's operations included):

- ``agree``: every node's :class:`~slurm_titan.ckpt.agree.NodeAgreement` on one restore candidate (the supervisor's
  restore round), all at once but the last node, ``LATE_S`` late;
- ``ram``: the RAM tier's holdings (:class:`~slurm_titan.ram.exchange.HoldingsExchange`): every node publishes its
  own, node 0 collects them, every node reads the collection (``NodeMemory.publish`` and ``recover``);
- ``report``: a hang that every node's watchdog sees within ``SPREAD_S``. Each node, as the supervisor's ``_hung`` and
  ``__call__`` do: the heartbeat's time noted (``batch_host.mark_beat``), its ranks' stacks written
  (``stacks.write_stacks``, right away: py-spy takes them in ~50 ms, which needs the ranks' processes), its report
  (``supervisor.write_report``, once: the first view alone is written only when the stacks take over
  ``supervisor.FIRST_VIEW_S``, and the report stays as the node's last: ``NodeSupervisor._finish``),
  ``Watchdog.wait_for_peers``, the batch shell's heartbeat checked (``batch_host.requeue_if_batch_shell_gone``),
  through the attempt's folder that the node holds open from its start.

A node's supervisor opens the attempt's folder (and the verdicts' and the RAM tier's in it) once at its start and
holds it, and builds its watchdog: here each node does so before each round, all nodes then start together, and
only the round is counted.

scontrol and srun shims on every process's PATH name node 0 the batch host and answer every probe.

Figures (ops: the file system's metadata operations): ``<round>_ops``, ``_s`` (the round's time), ``_ops_per_s``,
``_peak_ops_per_s`` (its busiest second), ``_lookup``, ``_list`` and ``_open`` (ops by what they were: getattr and
access; opendir, readdir and releasedir; open, create and release); ``agree_ok`` (nodes that agreed), ``ram_ok``
(nodes that gathered every holding); the longest
``report_write_max_s`` (a node's report and its stacks), ``report_peer_wait_max_s`` (``report_peer_timeouts``:
waits that ran out) and ``report_beat_check_max_s``; ``report_requeued`` (nodes that found the batch shell gone);
``report_read_s``, ``report_read_ops`` and ``report_read_ok`` (reports read): one read of all the reports after the
round (``finish``'s, as an attempt ends);
``heartbeat_gap_max_s``: the longest time between two touches of the heartbeat over the rounds, as the file system
saw them; with ``--as-ranks A``, each node polls on the schedule of a job of A / 8 nodes
(:mod:`slurm_titan.records.polls`) and ``<round>_peak_ops_per_s_as`` is the busiest second times A / ranks: that
many nodes each doing what one of these does (this machine's file system, one process for every mount, served
~3,300 ``stat`` calls a second from 64 mounts and ~1,350 from 256: a round of that many nodes run here would measure
it); ``folder_ops`` and ``folder_ops_per_s``: the rounds' ops, the busiest round's rate; ``load_avg``: the machine's
1-minute load average at the end (the times are this machine's: far above its core count, they stretch).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any, NamedTuple

from slurm_titan.ckpt import NodeAgreement
from slurm_titan.errors import ExitCode
from slurm_titan.node.batch import attribution, step_watch
from slurm_titan.node.budgets import Budgets, WatchdogSpec
from slurm_titan.node.supervisor import batch_host, stacks
from slurm_titan.node.supervisor.supervisor import write_report
from slurm_titan.node.supervisor.watchdog import PEER_WAIT_S, Hang, Watchdog
from slurm_titan.ram.choice import Holding
from slurm_titan.ram.exchange import HoldingsExchange
from slurm_titan.records import polls, run_folder
from slurm_titan.records.held_folder import HeldFolder
from tools.bench.scale_sim.goals import Goal, judge
from tools.local_fs.slow_fs import SlowFs

RANKS_PER_NODE = 8
DELAY_S = 0.020
PROCESSES = 8
START_S = 0.2
"""From a round's start to its nodes' first step (the task's way to the worker processes, which are ready)."""
LATE_S = 2.0
SPREAD_S = 1.0
STACK_TEXT = "Thread 0x7f00 (active): \"MainThread\"\n" + "    forward (torchtitan/models/llama3/model.py:300)\n" * 60
"""A rank's stacks as py-spy gives them, near their real size (~3 KB)."""
AGREE_TIMEOUT_S = 600.0
ATTEMPT, JOB_ID, STEP = 0, "1", 100
ROUNDS = ("agree", "ram", "report")
KINDS = {"lookup": ("getattr", "access"), "list": ("opendir", "readdir", "releasedir"),
         "open": ("open", "create", "release")}
SHIMS = {
    "scontrol": '[ "$1 $2" = "show job" ] && echo "JobId=$4 JobState=RUNNING BatchHost=n0 NodeList=n0" && exit 0\n'
                "exit 1\n",
    "srun": 'echo "srun: launching StepId=1.1"\n'
            'for arg; do case $arg in --nodelist=*) for host in $(echo "${arg#*=}" | tr , " "); do\n'
            '    echo "slurm-titan-probe $host"; done;; esac; done\n',
}

GOALS = (
    Goal("shared file system: metadata ops of the rounds, growth exponent in nodes", "folder_ops", 1.2,
         kind="growth", x="nodes"),
    *(Goal(f"shared file system: metadata ops/s of the {name} round, growth exponent in nodes", f"{name}_ops_per_s",
           1.2, kind="growth", x="nodes") for name in ROUNDS),
    *(Goal(f"shared file system: metadata ops/s of the {name} round at 512 nodes", f"{name}_ops_per_s", 10_000,
           at=4096) for name in ROUNDS),
    Goal("batch shell heartbeat: longest gap between touches with 20 ms lookups (s)", "heartbeat_gap_max_s", 2.0,
         kind="every"),
)

Result = dict[str, Any]


def _sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


def _on_path(shims: str) -> None:
    os.environ["PATH"] = f"{shims}{os.pathsep}{os.environ['PATH']}"


class _Sync(NamedTuple):
    """A round's start, shared by the harness and the workers: the nodes set up, then all start together."""
    ready: Synchronized[int]  # nodes set up
    go: Event  # set by the harness once every node is set up (and the round's counts taken)
    go_at: Synchronized[float]  # the round's start (time.time())


_SYNC: _Sync | None = None
"""A worker process's :class:`_Sync`."""


def _ready(shims: str, started: Barrier, sync: _Sync, listings_per_s: float) -> None:
    """A worker process's start: the shims on its PATH, the job's listing budget (the nodes' poll schedule), then it
    waits for the others (and the harness)."""
    global _SYNC
    _on_path(shims)
    _SYNC = sync
    polls.JOB_LISTINGS_PER_S = listings_per_s
    started.wait()


def _all_set_up() -> float:
    """This node is set up (its supervisor's start: not counted in the round): counted, then it waits for every
    node; the round's start."""
    assert _SYNC is not None
    with _SYNC.ready.get_lock():
        _SYNC.ready.value += 1
    _SYNC.go.wait()
    return _SYNC.go_at.value


def _run_group(task: Callable[..., Result], group: list[int], args: tuple[Any, ...]) -> list[Result]:
    """``task(node, *args)`` for each node of ``group``, a thread each (in one worker process)."""
    with ThreadPoolExecutor(len(group)) as threads:
        return list(threads.map(lambda node: task(node, *args), group))


def _agree_node(node: int, nodes: int, job_dirs: list[Path]) -> Result:
    with HeldFolder(run_folder.attempt_folder(job_dirs[node], ATTEMPT)) as attempt_dir, \
            attempt_dir.sub(run_folder.RESTORE_VERDICTS) as verdicts:  # as the supervisor holds them
        agree = NodeAgreement(verdicts, node, nodes, timeout_s=AGREE_TIMEOUT_S)
        _sleep_until(_all_set_up() + (LATE_S if node == nodes - 1 else 0.0))
        return {"ok": agree(STEP, "") == "", "end": time.time()}


def _ram_node(node: int, nodes: int, job_dirs: list[Path]) -> Result:
    """A node's RAM holding published and every node's gathered (``NodeMemory.publish``, then ``recover``'s
    gather): two steps of its ranks and its partner's."""
    ranks = list(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE))
    partner = [rank + RANKS_PER_NODE for rank in ranks] if node < nodes - 1 else list(range(RANKS_PER_NODE))
    with HeldFolder(run_folder.ram_folder(job_dirs[node], ATTEMPT)) as folder:
        exchange = HoldingsExchange(folder, node, nodes)
        _sleep_until(_all_set_up())
        exchange.publish(Holding(node, f"n{node}", 40000 + node, "t" * 32, {STEP: ranks + partner,
                                                                             STEP - 4: ranks + partner}))
        return {"ok": len(exchange.gather()) == nodes, "end": time.time()}


def _report_node(node: int, nodes: int, job_dirs: list[Path]) -> Result:
    job_dir, ranks = job_dirs[node], list(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE))
    watchdog = Watchdog(Budgets.from_spec(WatchdogSpec(), 600), ranks, job_dir, ATTEMPT, learns=False,
                        say=lambda text: None, nodes=nodes)
    attempt_dir = HeldFolder(run_folder.attempt_folder(job_dir, ATTEMPT))
    try:
        _sleep_until(_all_set_up() + SPREAD_S * node / nodes)
        times = [time.time()]  # the hang seen, reported, peers waited for, batch shell checked
        hang = Hang(ranks[0], STEP, "step", times[0] - 60, times[0], 45.0, "S", False, True)
        failed = batch_host.mark_beat(attempt_dir)
        stacks.write_stacks(watchdog.attempt_dir, node, dict.fromkeys(ranks, STACK_TEXT))
        write_report(attempt_dir, node, ExitCode.HANG, {}, None, hang, first_written=times[0])  # with the stacks
        times.append(time.time())
        watchdog.wait_for_peers()
        times.append(time.time())
        lost = batch_host.requeue_if_batch_shell_gone(attempt_dir, JOB_ID, failed, f"n{node}", nodes)
        times.append(time.time())
    finally:
        watchdog.close()
        attempt_dir.close()
    write_s, peer_wait_s, beat_check_s = (b - a for a, b in zip(times, times[1:]))
    return {"write_s": write_s, "peer_wait_s": peer_wait_s, "beat_check_s": beat_check_s,
            "requeued": lost is not None}


def _end_when(done: Event, srun: subprocess.Popen[bytes]) -> None:
    done.wait()
    srun.kill()


def _batch_shell(job_dir: Path, nodes: int, shims: str, done: Event) -> None:
    """The batch shell's step watcher over the attempt, until ``done``: then its srun stand-in ends."""
    _on_path(shims)
    srun = subprocess.Popen(["sleep", "3600"])
    threading.Thread(target=_end_when, args=(done, srun), daemon=True).start()
    step_watch.watch(job_dir, ATTEMPT, [f"n{node}" for node in range(nodes)], srun.pid)
    srun.wait()


Run = Callable[..., list[Result]]
"""``run(task, start, *args)``: ``task(node, *args)`` on every node; once every node is set up (:func:`_all_set_up`),
``start()`` gives the round's start."""


@contextmanager
def _workers(nodes: int, shims: Path, listings_per_s: float) -> Iterator[Run]:
    """:data:`Run` over every node, the nodes spread as threads over worker processes (whose job listing budget is
    ``listings_per_s``), started (and ready) before it is given."""
    context = multiprocessing.get_context("spawn")
    count = min(nodes, PROCESSES)
    groups = [list(range(first, nodes, count)) for first in range(count)]
    started = context.Barrier(count + 1)
    sync = _Sync(context.Value("i", 0), context.Event(), context.Value("d", 0.0))
    with context.Pool(count, initializer=_ready, initargs=(str(shims), started, sync, listings_per_s)) as pool:
        started.wait()

        def run(task: Callable[..., Result], start: Callable[[], float], *args: Any) -> list[Result]:
            sync.ready.value = 0
            sync.go.clear()
            pending = pool.starmap_async(_run_group, [(task, g, args) for g in groups])
            while sync.ready.value < nodes:
                if pending.ready():
                    pending.get()  # a node failed before it was set up: its error
                    raise RuntimeError(f"{task.__name__}: the nodes ended before all were set up")
                time.sleep(0.01)
            sync.go_at.value = start()
            sync.go.set()
            return [result for group in pending.get() for result in group]

        yield run


def _counted(before: dict[str, Any], after: dict[str, Any], prefix: str, seconds: float) -> dict[str, float]:
    """The metadata operations between two snapshots of the file system's stats, as figures of one round."""
    ops = {kind: n - before["metadata"].get(kind, 0) for kind, n in after["metadata"].items()}
    total = sum(ops.values())
    per_second = [n - before["per_second"].get(second, 0) for second, n in after["per_second"].items()]
    return {f"{prefix}_ops": float(total), f"{prefix}_s": seconds, f"{prefix}_ops_per_s": total / seconds,
            f"{prefix}_peak_ops_per_s": float(max(per_second, default=0))} | {
        f"{prefix}_{name}": float(sum(ops.get(kind, 0) for kind in kinds)) for name, kinds in KINDS.items()}


def _starter(fs: SlowFs) -> tuple[Callable[[], float], dict[str, Any]]:
    """A round's ``start`` for :data:`Run`, and what it took when called: the file system's stats then
    (``before``) and the round's start (``at``, ``START_S`` later)."""
    taken: dict[str, Any] = {}

    def start() -> float:
        taken.update(before=fs.stats(), at=time.time() + START_S)
        return float(taken["at"])

    return start, taken


def _outcome_round(fs: SlowFs, run: Run, task: Callable[..., Result], name: str,
                   job_dirs: list[Path]) -> dict[str, float]:
    """A round whose nodes each say whether it ended as it should (``ok``) and when (``end``)."""
    start, taken = _starter(fs)
    results = run(task, start, len(job_dirs), job_dirs)
    end = max(r["end"] for r in results)
    return _counted(taken["before"], fs.stats(), name, end - taken["at"]) | {
        f"{name}_ok": float(sum(r["ok"] for r in results))}


def _report_round(fs: SlowFs, run: Run, job_dirs: list[Path]) -> dict[str, float]:
    start, taken = _starter(fs)
    results = run(_report_node, start, len(job_dirs), job_dirs)
    return _counted(taken["before"], fs.stats(), "report", time.time() - taken["at"]) | {
        "report_write_max_s": max(r["write_s"] for r in results),
        "report_peer_wait_max_s": max(r["peer_wait_s"] for r in results),
        "report_peer_timeouts": float(sum(r["peer_wait_s"] >= PEER_WAIT_S for r in results)),
        "report_beat_check_max_s": max(r["beat_check_s"] for r in results),
        "report_requeued": float(sum(r["requeued"] for r in results))}


@contextmanager
def _watching(fs: SlowFs, job_dir: Path, nodes: int, shims: Path) -> Iterator[str]:
    """The batch shell's step watcher over the attempt (in a process of its own), from its second heartbeat on (the
    first creates the file, and the kernel's release of it comes later: counted in no round); gives the heartbeat's
    path as the file system's stats name it."""
    context = multiprocessing.get_context("spawn")
    done = context.Event()
    shell = context.Process(target=_batch_shell, args=(job_dir, nodes, str(shims), done))
    shell.start()
    beat = run_folder.batch_shell_beat(job_dir, ATTEMPT).relative_to(fs.mountpoints[0])
    try:
        while not fs.stats()["touches"].get(f"/{beat}"):  # a touch of the file, not its creation
            if not shell.is_alive():
                raise RuntimeError(f"the batch shell's step watcher ended with code {shell.exitcode}")
            time.sleep(0.05)
        yield f"/{beat}"
    finally:
        done.set()
        shell.join()


def _heartbeat(touches: list[float]) -> dict[str, float]:
    return {"heartbeat_touches": float(len(touches)),
            "heartbeat_gap_max_s": max((b - a for a, b in zip(touches, touches[1:])), default=float("inf"))}


def _read_all(fs: SlowFs, job_dir: Path, nodes: int) -> dict[str, float]:
    """One read of every node's report, as ``finish`` makes it once an attempt ended: its time and operations."""
    before, start = sum(fs.stats()["metadata"].values()), time.monotonic()
    read = len(attribution.read_reports(job_dir, ATTEMPT, nodes))
    return {"report_read_s": time.monotonic() - start, "report_read_ops": sum(fs.stats()["metadata"].values()) - before,
            "report_read_ok": float(read)}


def _write_shims(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, body in SHIMS.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return folder


def measure(ranks: int, workdir: Path, delay_s: float = DELAY_S, cache_s: float = 0.0,
            as_ranks: int | None = None) -> dict[str, float]:
    """One row: the rounds at ``ranks`` simulated ranks, on a fresh slow file system under ``workdir`` whose
    metadata operations take ``delay_s`` each, its clients keeping names and attributes ``cache_s`` seconds; each node
    polling as one of ``as_ranks`` would (the module's docstring)."""
    nodes = max(ranks // RANKS_PER_NODE, 1)
    scale = (as_ranks or ranks) / ranks
    root = workdir / f"folder-{ranks}"
    shutil.rmtree(root, ignore_errors=True)
    shims = _write_shims(root / "bin")
    mounts = [root / "mnt" / str(node) for node in range(nodes)]
    with SlowFs(root / "backing", mounts, delay_s, cache_s=cache_s) as fs, \
            _workers(nodes, shims, polls.JOB_LISTINGS_PER_S / scale) as run:
        job_dirs = [mount / "runs" / "sim" / JOB_ID for mount in fs.mountpoints]
        run_folder.attempt_folder(job_dirs[0], ATTEMPT).mkdir(parents=True)
        with _watching(fs, job_dirs[0], nodes, shims) as beat:
            row = {"ranks": float(ranks), "nodes": float(nodes)}
            row |= _outcome_round(fs, run, _agree_node, "agree", job_dirs)
            row |= _outcome_round(fs, run, _ram_node, "ram", job_dirs)
            row |= _report_round(fs, run, job_dirs) | _heartbeat(fs.stats()["touches"].get(beat, []))
        row |= _read_all(fs, job_dirs[0], nodes)
    if as_ranks:
        row |= {f"{name}_peak_ops_per_s_as": row[f"{name}_peak_ops_per_s"] * scale for name in ROUNDS}
    return row | {"folder_ops": sum(row[f"{name}_ops"] for name in ROUNDS),
                  "folder_ops_per_s": max(row[f"{name}_ops_per_s"] for name in ROUNDS),
                  "load_avg": os.getloadavg()[0]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m tools.bench.scale_sim.folder")
    ap.add_argument("ranks", type=int, nargs="*", default=[64, 128, 256, 512])
    ap.add_argument("--cache", type=float, default=0.0, help="seconds the clients keep names and attributes")
    ap.add_argument("--as-ranks", type=int, help="each node polls as one of a job of this many ranks would")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="scale-sim-folder-") as tmp:
        rows = [measure(n, Path(tmp), cache_s=args.cache, as_ranks=args.as_ranks) for n in args.ranks]
    for row in rows:
        print(json.dumps({key: round(value, 3) for key, value in row.items()}))
    for goal in GOALS:
        print(judge(rows, goal).line())
