"""While an attempt's srun step runs, end it once a node of it is lost (runs in the batch shell).

srun waits for every task of its step, and a node that died answers nothing: srun then waits until
slurmctld marks the node down (SlurmdTimeout, 300 s by default; "srun: error: Node failure on n2").
The surviving nodes' supervisors report within seconds (their ranks fail on the lost peer), so once
some node has reported and others stay silent for `grace_s`, the silent ones are probed
(`node.srun_probe.probe_failures`); if one does not answer, it is recorded in the attempt's folder
(:func:`record_lost`), srun is killed and the batch shell goes on to `finish`, which blames that node without
probing again (:func:`found_lost`: one probe round per failure). Beside that it judges the nodes' speed
(node.batch.slow_watch): a slow node to swap gets srun Slurm's warning signal (USR2, which srun passes on to
every node's supervisor): the ranks save the current step and stop, and `finish` restarts without the node.
While it watches, it touches the attempt's batch-shell heartbeat (``run_folder.BATCH_SHELL_BEAT``), which tells the
other nodes' supervisors (`node.supervisor.batch_host`) that the batch shell still lives to decide what follows a
failure. It lists the reports and touches the heartbeat through the attempt's folder held open
(``records.held_folder``: a lookup of one name, not of every name of the path, on a shared file system), and records
when each report first appeared on its own clock (``report-sightings.json``), the one clock on which `finish` orders
the nodes' failures (``attribution.on_one_clock``). The first report of a failure it sees starts the next
attempt's srun step ahead on the same nodes, or with `preemption.standby_step` the attempt's first trained step
does (its trained-step file in the same listing; node.batch.ahead; the step is this process's child, so the first
attempt's watcher process stays until that step ends). The first
attempt's watcher is started by the batch set-up beside submitit's srun (`--shell-pid`: it finds srun among the
batch shell's children); `finish` watches the steps it starts itself with :func:`watch`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from slurm_titan import envvars
from slurm_titan.errors import ExitCode
from slurm_titan.node.batch import ahead, attribution
from slurm_titan.node.batch.processes import alive, command, parent
from slurm_titan.node.batch.slow_watch import SlowNodeWatch
from slurm_titan.node.batch_spec import load_or_exit
from slurm_titan.node.node_log import say
from slurm_titan.node.process_exit import wait_for_exit
from slurm_titan.node.srun_probe import probe_failures
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder

GRACE_S = 3.0  # a probe of a node that is only slow to report costs one `srun true`; waiting costs the run
POLL_S = 1.0
SIGHT_POLL_S = 0.2
"""How often the reports are listed: the resolution of their sightings, the one clock of the nodes' failures (a
listing is ~5 metadata operations: 25 a second from the batch shell, whatever the node count)."""
REPROBE_MAX_S = 60.0
FIND_SRUN_S = 120.0


def record_lost(job_dir: Path, attempt: int, hosts: list[str]) -> None:
    """The nodes of `attempt` that the watcher's probe found lost (written before it ends the step)."""
    run_folder.lost_nodes(job_dir, attempt).write_text(json.dumps(hosts))


def found_lost(job_dir: Path, attempt: int) -> set[str] | None:
    """The nodes the watcher found lost in `attempt` (:func:`record_lost`), None when it found none."""
    try:
        return set(json.loads(run_folder.lost_nodes(job_dir, attempt).read_text()))
    except (OSError, ValueError, TypeError):
        return None


class _Background:
    """A thread of its own for the ``with`` block: :meth:`_run` until the block ends (``self._stop`` set)."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _Beating(_Background):
    """Touches the attempt's batch-shell heartbeat every `period_s` from a thread of its own, so that the beat never
    waits on the watcher's reads of the job folder (slow on a busy shared file system)."""

    def __init__(self, attempt_dir: HeldFolder, period_s: float) -> None:
        super().__init__("batch-shell-beat")
        self.attempt_dir, self.period_s = attempt_dir, period_s

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):  # the file system's hiccup: the next beat
                self.attempt_dir.touch(run_folder.BATCH_SHELL_BEAT)
            self._stop.wait(self.period_s)


class _Sightings(_Background):
    """When each node's report first appeared, on this (the batch shell's) clock: one clock for every node's events
    (:func:`attribution.on_one_clock`). Listed every ``SIGHT_POLL_S`` from a thread of its own, so that a probe the
    watcher waits on delays no sighting; written to ``run_folder.REPORT_SIGHTINGS`` as they come."""

    def __init__(self, attempt_dir: HeldFolder) -> None:
        super().__init__("report-sightings")
        self.attempt_dir = attempt_dir
        self.seen: dict[int, float] = {}
        self.before: set[int] | None = None  # the reports already there at the first listing: when is unknown
        self.changed = threading.Event()  # set when a listing found a new report, or the first trained step
        self.trained = threading.Event()  # set when a listing found the attempt's trained-step file
        self.ahead_ended = threading.Event()  # set when a listing found the exit code of the step started ahead
        self._lock = threading.Lock()

    def nodes(self) -> set[int]:
        """The nodes whose report has appeared (as of the last listing)."""
        with self._lock:
            return set(self.seen) | (self.before or set())

    def _look(self) -> None:
        try:
            names = self.attempt_dir.names()  # one listing: no report is read
        except OSError:  # the file system's hiccup: the next listing
            return
        reported, now = run_folder.node_numbers(names, ".json"), time.time()
        if not self.trained.is_set() and run_folder.TRAINED_STEP in names:
            self.trained.set()
            self.changed.set()
        if run_folder.AHEAD_EXIT in names:
            self.ahead_ended.set()
        with self._lock:
            if self.before is None:
                self.before = reported  # not sighted: written before this watcher looked (the nodes' clocks decide)
            elif new := reported - self.seen.keys() - self.before:
                self.seen |= dict.fromkeys(new, now)
                self.changed.set()
                with contextlib.suppress(OSError):  # written again with the next report
                    self.attempt_dir.replace_text(run_folder.REPORT_SIGHTINGS, json.dumps(self.seen))
                with contextlib.suppress(OSError):  # a beat now: the node waits for one after its failure to exit
                    self.attempt_dir.touch(run_folder.BATCH_SHELL_BEAT)  # (node.supervisor.batch_host)

    def _run(self) -> None:
        while True:
            self._look()
            if self._stop.wait(SIGHT_POLL_S):
                self._look()  # the reports written as the step ended
                return


def failure_reported(attempt_dir: HeldFolder, node: int) -> bool:
    """Whether node `node`'s report says its ranks failed (or hung): not finished, stopped to requeue, or a
    preflight failure (which is not restarted on the same nodes)."""
    return run_folder.reported_exit_code(attempt_dir, node) not in (None, 0, ExitCode.PREEMPTED, ExitCode.PREFLIGHT)


def watch(job_dir: Path, attempt: int, hosts: list[str], srun_pid: int, *, grace_s: float = GRACE_S,
          poll_s: float = POLL_S, probe: Callable[[list[str]], set[str]] = probe_failures,
          slow: SlowNodeWatch | None = None, start_next: Callable[[bool], bool] | None = None,
          standby: bool = False) -> list[str]:
    """Watch until srun ends; kill it when silent nodes of the attempt do not answer (recorded first:
    :func:`record_lost`). Returns those nodes.

    Silent nodes that answered a probe are probed again only after twice the wait (up to REPROBE_MAX_S): one
    probe round per failure, not one every `grace_s` while the reports trickle in. With `slow`, a node it
    names for a swap ends the attempt with one USR2 to srun (the ranks save and stop). `start_next` is called
    once, as the first report of a failure is seen (each new report is read once), or with `standby` as soon as
    the attempt trained a step (node.batch.ahead; called with True then: a standby step); once more at a failure
    when that standby step ended before it (a rank of it lost, say)."""
    waiting_since: float | None = None
    wait_s = grace_s
    swapping = False
    read: set[int] = set()  # the reports read for a failure
    failed, standing_by = False, False
    with HeldFolder(run_folder.attempt_folder(job_dir, attempt)) as attempt_dir, _Beating(attempt_dir, poll_s), \
            _Sightings(attempt_dir) as sightings:
        threading.Thread(target=_wake_at_exit, args=(srun_pid, sightings.changed), name="srun-exit",
                         daemon=True).start()  # srun's end is heard at once, not at the next poll
        while alive(srun_pid):
            if slow and not swapping and slow.poll():
                swapping = True
                os.kill(srun_pid, signal.SIGUSR2)
            reported = sightings.nodes()
            if start_next is not None and not failed and (new := reported - read):
                read |= new
                if any(failure_reported(attempt_dir, node) for node in sorted(new)):
                    failed = True
                    if not standing_by or sightings.ahead_ended.is_set():  # none yet, or the standby is gone
                        _start(start_next, attempt, "failed", standby=False)
            if start_next is not None and standby and not (failed or standing_by) and sightings.trained.is_set():
                standing_by = True
                _start(start_next, attempt, "trains (a standby step)", standby=True)
            silent = attribution.silent_nodes(reported, hosts)
            if len(silent) == len(hosts) or not silent:
                waiting_since, wait_s = None, grace_s
            elif waiting_since is None:
                waiting_since = time.monotonic()
            elif time.monotonic() - waiting_since >= wait_s:
                if lost := sorted(probe(silent)):
                    print(f"slurm-titan: {','.join(lost)} of attempt {attempt} does not answer: ending its srun step "
                          "instead of waiting for Slurm to mark the node down", file=sys.stderr, flush=True)
                    record_lost(job_dir, attempt, lost)
                    os.kill(srun_pid, signal.SIGKILL)
                    return lost
                waiting_since, wait_s = time.monotonic(), min(2 * wait_s, REPROBE_MAX_S)
            sightings.changed.wait(poll_s)  # a new report is looked at as it is sighted
            sightings.changed.clear()
    return []


def _wake_at_exit(pid: int, wake: threading.Event) -> None:
    """Set ``wake`` as ``pid`` ends (nothing where pidfds are missing: the watcher's poll hears of it)."""
    if wait_for_exit([pid], None):
        wake.set()


def _start(start_next: Callable[[bool], bool], attempt: int, why: str, standby: bool) -> None:
    """Start the next attempt's step ahead (none once the batch shell decided what follows the attempt); a failure
    to is a warning (a restart then starts its own step later)."""
    try:
        if start_next(standby):
            say(f"attempt {attempt} {why}: the next attempt's step started ahead on its nodes")
    except Exception as error:  # noqa: BLE001 - the restart only starts later without it
        print(f"slurm-titan: WARNING: attempt {attempt} {why}; its next attempt's step could not be started ahead "
              f"({type(error).__name__}: {error})", file=sys.stderr, flush=True)


def find_srun(shell_pid: int, timeout_s: float = FIND_SRUN_S) -> int | None:
    """The pid of the `srun` that `shell_pid` (the batch shell) starts, once it is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(shell_pid):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and command(int(entry.name)) == "srun" and parent(int(entry.name)) == shell_pid:
                return int(entry.name)
        time.sleep(0.2)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--shell-pid", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGUSR2, lambda *_: None)  # Slurm's warning is for the ranks (caught, not ignored: the
    # srun started ahead must not inherit an ignored USR2, which the slow-node swap sends it)
    srun = find_srun(args.shell_pid)
    if srun is not None:
        attempt, hosts = int(os.environ[envvars.ATTEMPT_INDEX]), os.environ[envvars.NODES].split(",")
        spec = load_or_exit(args.job_dir)
        slow = SlowNodeWatch.for_attempt(spec, args.job_dir, attempt, hosts, os.environ)

        def start_next_ahead(standby: bool) -> bool:
            return ahead.start_ahead(args.job_dir, os.environ["SLURM_JOB_ID"], attempt, tuple(hosts), os.environ,
                                     standby) is not None

        watch(args.job_dir, attempt, hosts, srun, slow=slow, start_next=start_next_ahead, standby=spec.standby_step)
    return 0  # a step started ahead is this process's child: its recorder thread keeps the process until it ends


if __name__ == "__main__":
    sys.exit(main())
