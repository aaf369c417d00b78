"""The node supervisor's progress watchdog: a rank that makes no progress within its phase's budget is a hang.

Every rank rewrites its progress record (records.rank_progress) in a node-local folder this watchdog makes;
each poll of the supervisor reads them and compares the time since each rank's last progress with its
phase's budget (node.budgets); the records also go to the node's timing report (node.supervisor.timing). On a
hang it dumps the stacks of every rank of the node (node.supervisor.stacks) into
`<job>/attempts/<A>/stacks/node-<N>.txt` and names the node's culprit (node.culprit): a rank that does not run at
all (stopped, or in uninterruptible sleep) first, then one that is not waiting in a collective, then the one least
far in steps and phases, then the one whose last progress is the oldest. The supervisor then kills the ranks and
reports the hang (ExitCode.HANG); attribution compares the hangs of all nodes with the same key. A rank seen stopped
at every poll, its CPU time frozen, has a shorter budget in every phase (node.budgets), and a node whose culprit was
found so does not wait for the other nodes' views: none can be stronger.

When one rank hangs, its peers on the other nodes soon wait in a collective and stop making progress too:
their nodes' watchdogs fire as well (same phase, nearly the same `since`), each reports its own view, and the
key above tells the stuck rank from the waiting ones. Each node waits for the others' reports (up to
PEER_WAIT_S) before it kills its ranks, so that no node's exit disturbs another's view. A node whose
watchdog has not fired yet loses its ranks to the first node's kill (their collectives fail) or to srun
(--kill-on-bad-exit) once that node exits non-zero: a crash after the first hang was seen, which
attribution does not blame.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan import envvars
from slurm_titan.node import budgets
from slurm_titan.node.budgets import Budgets, Calibration
from slurm_titan.node.culprit import culprit_key
from slurm_titan.node.supervisor import stacks
from slurm_titan.node.supervisor.timing import TimingReport
from slurm_titan.records import rank_progress, run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.polls import poll_waits
from slurm_titan.records.rank_progress import Progress

PEER_WAIT_S = 15.0
"""How long a node that saw a hang waits, before killing its ranks, for every other node's report."""
PEER_POLL_MAX_S = 1.0
"""The longest pause between two looks for those reports."""


@dataclass(frozen=True)
class Hang:
    """A node's view of a hang, as its report carries it (`hang`)."""

    rank: int
    step: int
    phase: str  # Phase.label
    since: float  # the culprit's last progress
    time: float  # when the watchdog fired
    budget_s: float
    state: str  # the kernel's process state when it fired (T: stopped, D: uninterruptible, S: sleeping)
    frozen: bool
    in_collective: bool | None  # None: no stack to tell

    def as_dict(self) -> dict:
        return asdict(self)


def _scratch_root() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


class Watchdog:
    """One node's watchdog over its ranks (global rank numbers)."""

    def __init__(self, limits: Budgets, ranks: list[int], job_dir: Path, attempt: int, learns: bool,
                 say: Callable[[str], None], node: int = 0, nodes: int = 1, timing: TimingReport | None = None) -> None:
        self.limits, self.job_dir, self.attempt, self.say, self.learns = limits, job_dir, attempt, say, learns
        self.node, self.nodes, self.timing = node, nodes, timing
        self.attempt_dir = HeldFolder(run_folder.attempt_folder(job_dir, attempt))  # the peers' reports
        self.folder = Path(tempfile.mkdtemp(prefix="slurm-titan-progress-", dir=_scratch_root()))
        self.records = {rank: self.folder / f"rank-{rank}.progress" for rank in ranks}
        self.dumper = stacks.StackDumper({rank: self.folder / f"rank-{rank}.stack" for rank in ranks})
        self.learned = budgets.read_calibration(job_dir).slowest_step_s
        self.armed_at: float | None = None
        self.stopped_since: dict[int, float] = {}  # rank -> the first of the calls of overdue() that saw it stopped
        self.stopped_cpu: dict[int, int] = {}  # rank -> its CPU ticks then: a stop that lets it run is no hang
        self.late_stopped: set[int] = set()  # the ranks the last overdue() found late by the stopped budget
        now = time.time()
        for path in self.records.values():
            rank_progress.create(path, now)
        if self.learned:
            say(f"watchdog: calibrated from earlier attempts: slowest step {self.learned:.1f} s, step budget "
                f"{limits.step_budget(self.learned):.0f} s")

    def rank_env(self, rank: int) -> dict[str, str]:
        return {envvars.PROGRESS_FILE: str(self.records[rank]), envvars.STACK_FILE: str(self.dumper.local_files[rank])}

    def arm(self) -> None:
        """Start watching (after the node's restore: until then the ranks wait at its gate on purpose)."""
        self.armed_at = time.time()

    def read(self) -> dict[int, Progress]:
        return {rank: record for rank, path in self.records.items() if (record := rank_progress.read(path))}

    def overdue(self, running: dict[int, int], now: float | None = None) -> list[int]:
        """The running ranks (rank -> pid) past their phase's budget, or stopped past their stopped budget
        (:meth:`Budgets.stopped_budget`: seen stopped at every call since, with no CPU time used meanwhile: a
        duty-cycled stop, e.g. a CPU limiter's, lets it run between calls); learns the slowest step on the
        way. The ranks late by the stopped budget alone are kept in `late_stopped`."""
        if self.armed_at is None:
            return []
        now = time.time() if now is None else now
        for rank, pid in running.items():
            state, cpu_ticks = stacks.process_sample(pid)
            if not stacks.stopped(state):
                self.stopped_since.pop(rank, None)
            elif self.stopped_cpu.get(rank) != cpu_ticks or rank not in self.stopped_since:
                self.stopped_since[rank], self.stopped_cpu[rank] = now, cpu_ticks  # it ran since: start over
        progress = self.read()
        self._learn(max((p.slowest_step_s for p in progress.values()), default=0.0))
        if self.timing:
            self.timing.offer(progress, now)
        late, self.late_stopped = [], set()
        for rank, record in progress.items():
            if rank not in running:
                continue
            since = max(record.since, self.armed_at)
            budget = self.limits.for_progress(record, self.learned)
            stopped = self.limits.stopped_budget(record, self.learned)
            if budget is not None and now - since > budget:
                late.append(rank)
            elif (stopped is not None and rank in self.stopped_since
                  and now - max(since, self.stopped_since[rank]) >= stopped):
                late.append(rank)
                self.late_stopped.add(rank)
        return late

    def _learn(self, slowest: float) -> None:
        if slowest > self.learned:
            self.learned = slowest
            if self.learns:
                budgets.write_calibration(self.job_dir, Calibration(slowest))

    def first_view(self, pids: dict[int, int], now: float) -> Hang:
        """The node's culprit from the records and process states alone (before the stacks are taken)."""
        return self._culprit(self.read(), {rank: stacks.process_state(pid) for rank, pid in pids.items()}, now, {})

    def investigate(self, pids: dict[int, int], now: float) -> Hang:
        """Dump every rank's stacks, then name the culprit with them (and with the records and process
        states from before the dump: the faulthandler fallback wakes a stopped rank, which then runs on)."""
        progress, states = self.read(), {rank: stacks.process_state(pid) for rank, pid in pids.items()}
        taken = self.dumper.dump(pids, self.attempt_dir, self.node)
        self.say(f"watchdog: stacks of ranks {','.join(map(str, sorted(taken)))} in "
                 f"{run_folder.stacks_folder(self.job_dir, self.attempt) / run_folder.node_stacks_name(self.node)} "
                 f"(by {self.dumper.method}{': ' + self.dumper.why if self.dumper.why else ''})")
        return self._culprit(progress, states, now, taken)

    def _culprit(self, progress: dict[int, Progress], states: dict[int, str], now: float,
                 taken: dict[int, str]) -> Hang:
        views = []
        for rank, state in states.items():
            record = progress.get(rank) or Progress(rank_progress.Phase.STARTUP, 0, self.armed_at or now)
            budget = (rank in self.late_stopped and self.limits.stopped_budget(record, self.learned)) or (
                self.limits.for_progress(record, self.learned) or 0.0)
            views.append(Hang(rank, record.step, record.phase.label, max(record.since, self.armed_at or 0.0), now,
                              budget, state, stacks.frozen(state),
                              stacks.in_collective(taken[rank]) if rank in taken else None))
        return min(views, key=lambda view: culprit_key(view.as_dict()))

    def wait_for_peers(self, timeout_s: float = PEER_WAIT_S, poll_s: float = 0.2) -> None:
        """Wait until every node of the attempt has reported (its own hang, or how it ended), at most
        `timeout_s`. The first node to see a hang must not end its ranks at once: its exit makes srun
        SIGCONT and SIGTERM the other nodes' tasks, which wakes a stopped rank before its own node's
        watchdog could see it stopped (the strongest sign of the stuck rank). One listing a poll, the polls
        growing from `poll_s` to 1 s and spread (every node waits at once: on a shared file system, M nodes' polls,
        :mod:`slurm_titan.records.polls`), through the attempt's folder held open (no walk of the whole path at each
        poll); the first after one wait, not as this node's report is written: every node of a hang writes its own
        within the same second, and the others' are seldom all there yet."""
        if self.nodes <= 1:
            return
        deadline, waits = time.monotonic() + timeout_s, poll_waits(self.nodes, poll_s, PEER_POLL_MAX_S)
        while True:
            time.sleep(min(next(waits), max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline or len(
                    run_folder.node_numbers(self.attempt_dir.names(), ".json")) >= self.nodes:
                return

    def close(self) -> None:
        self.attempt_dir.close()
        shutil.rmtree(self.folder, ignore_errors=True)
