"""The node supervisor: the one Slurm task per node, started by submitit on every node of a job.

It derives the rendezvous from Slurm's variables, starts one training process per device with
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (each imports torch and torchtitan, then waits for the
word to train: given after the node's preflight, and in a step the batch shell started ahead of its decision,
node.batch.ahead, only once that decision is to train here), streams each rank's output to
`<job>/logs/rank-R.log`, passes Slurm's warning signals on to the ranks, stops the node's other
ranks when one fails, watches their progress (`slurm_titan.node.supervisor.watchdog`: a rank without progress
within its phase's budget is a hang: the node's stacks are dumped and its ranks killed), and reports
the node's outcome to `<job>/attempts/<A>/node-<N>.json` for the batch script's final decision
(`slurm_titan.node.batch.finish`).

Exit code: 0 when the ranks finished or checkpointed for a requeue (so srun's
`--kill-on-bad-exit` does not cut short another node's upload), the failing rank's code otherwise,
ExitCode.HANG after a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from slurm_titan import envvars
from slurm_titan.doctor import MEMORY_CHECK, PreflightFailed, run_preflight
from slurm_titan.doctor.facts import read_ephemeral_range
from slurm_titan.doctor.report import format_table
from slurm_titan.errors import ExitCode, SlurmTitanError
from slurm_titan.node.node_log import say
from slurm_titan.node.process_exit import wait_for_exit
from slurm_titan.node.spec import NodeSpec
from slurm_titan.node.supervisor import batch_host, presence, rendezvous, restore
from slurm_titan.node.supervisor.ram import NodeMemory
from slurm_titan.node.supervisor.timing import TimingReport
from slurm_titan.node.supervisor.watchdog import Hang, Watchdog
from slurm_titan.records import history, run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.records.polls import poll_waits
from slurm_titan.records.restore_verdict import PlanRequest, Reads, RestoreVerdict, read_reads
from slurm_titan.signals import ignore_signals, take_stop_signals
from slurm_titan.thread_priority import BACKGROUND_NICE, lower_session_priority

STOP_GRACE_S = 15.0
POLL_S = 0.5
PLAN_POLL_S = 0.05  # how often a plan request looks for the ranks' answers
WORD_POLL_S = 0.2
"""How often a step started ahead looks for the batch shell's word (one lookup through the held attempt folder), at
most: a large job's nodes look less often (records.polls)."""
WORD_WAIT_S = 300.0
"""How long a step started ahead waits for that word, once the attempt it follows ended on its node, before it ends
by itself (a batch shell that died)."""
FIRST_VIEW_S = 1.0
"""How long a hung node's stack dump may take before its report says its first view (the culprit without stacks)."""


def write_report(attempt_dir: HeldFolder, node: int, code: int, rank_codes: dict[int, int],
                 failed_first: dict[str, float | int] | None = None, hang: Hang | None = None, *,
                 first_written: float) -> None:
    """Write node `node`'s report for the batch script's decision: the node's first failing rank, its exit code and
    when it was seen, or its hang (rank, step, phase, since, time), for the attribution, and when the node wrote its
    first report of the attempt (`first_written`, its clock: the batch shell's watcher saw it then, on its own).
    Replaced at once (tmp + rename, through the attempt's folder held open): a reader sees the old report or the new
    one."""
    attempt_dir.replace_text(run_folder.node_report_name(node), json.dumps({
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "exit_code": code,
        "ranks": {str(r): c for r, c in rank_codes.items()}, "first_failure": failed_first,
        "hang": hang and hang.as_dict(), "first_written": first_written}))


def failed_elsewhere(attempt_dir: HeldFolder, node: int) -> int | None:
    """Another node of the attempt whose report says it failed (the lowest such number), None when none has: one
    listing of the attempt's folder, then the other nodes' reports read until one failed."""
    try:
        others = sorted(run_folder.node_numbers(attempt_dir.names(), ".json") - {node})
    except OSError:
        return None
    return next((other for other in others
                 if run_folder.reported_exit_code(attempt_dir, other) not in (None, 0, ExitCode.PREEMPTED)), None)


def first_failure(codes: dict[int, int | None]) -> tuple[int, int] | None:
    """(rank, exit code) of the lowest rank that failed (neither running, finished nor checkpointed to stop)."""
    failed = sorted((rank, code) for rank, code in codes.items() if code not in (None, 0, ExitCode.PREEMPTED))
    return failed[0] if failed else None


class RankGroup:
    """The training processes of this node. Each imports torch and torchtitan, then waits at a pipe (rank.start_gate)
    until :meth:`start` gives the word, with the environment settled since. With `gated`, each rank's checkpoint
    hook then waits on a second pipe (rank.restore_gate) until :meth:`release` says how the node's restore went;
    meanwhile :meth:`plan` may ask it what its load reads. With a `watchdog`, :meth:`wait` also ends on a hang
    (from the release on, or from the start ungated)."""

    def __init__(self, argv: list[str], env: dict[str, str], rdzv: rendezvous.Rendezvous, job_dir: Path,
                 gated: bool = False, watchdog: Watchdog | None = None,
                 on_failure: Callable[[], None] = lambda: None) -> None:
        run_folder.rank_logs_folder(job_dir).mkdir(parents=True, exist_ok=True)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.failed_first: dict[str, float | int] | None = None  # rank, exit_code, time: the first failure seen
        self.exit_times: dict[int, float] = {}  # when each rank exited, as its waiter thread saw it
        self.gates: dict[int, int] = {}  # write ends of the ranks' restore pipes, by rank
        self.starts: dict[int, int] = {}  # write ends of the ranks' start pipes, by rank, until start()
        self.gated = gated
        self.gate_lock = threading.Lock()  # the restore's thread plans, the supervisor's may release
        self.watchdog = watchdog
        self.hang: Hang | None = None  # the hang that ended wait(), once the watchdog saw one
        self.on_failure = on_failure  # called once, when the first failure or the hang is seen
        for local_rank in range(rdzv.procs_per_node):
            rank_env = env | rdzv.process_env(local_rank)
            rank = int(rank_env["RANK"])
            if watchdog:
                rank_env |= watchdog.rank_env(rank)
            start = os.pipe()
            rank_env[envvars.START_FD] = str(start[0])
            self.starts[rank] = start[1]
            gate = os.pipe() if gated else None
            if gate:
                rank_env[envvars.RESTORE_FD] = str(gate[0])
                self.gates[rank] = gate[1]
            read_ends = (start[0], *gate[:1]) if gate else (start[0],)
            with run_folder.rank_log(job_dir, rank).open("ab") as log:
                self.processes[rank] = subprocess.Popen(argv, env=rank_env, stdout=log, stderr=subprocess.STDOUT,
                                                        preexec_fn=ignore_signals, pass_fds=read_ends)
            for fd in read_ends:
                os.close(fd)
            threading.Thread(target=self._time_exit, args=(rank,), name=f"rank-{rank}-waiter", daemon=True).start()

    def start(self, env: dict[str, str]) -> None:
        """Give every rank the word to train, with `env` added to its environment (armed from here when ungated)."""
        word = json.dumps(env).encode() + b"\n"
        for fd in self.starts.values():
            with contextlib.suppress(BrokenPipeError):  # that rank has exited already: wait() sees it
                os.write(fd, word)
            os.close(fd)
        self.starts.clear()
        if self.watchdog and not self.gated:
            self.watchdog.arm()

    def _time_exit(self, rank: int) -> None:
        """Block on one rank and note when it exited: the attribution compares these times across nodes,
        so that the rank that died first is blamed, not the peers that died after it in a collective."""
        self.processes[rank].wait()
        self.exit_times[rank] = time.time()

    def release(self, verdict: RestoreVerdict | None) -> None:
        """Let the ranks go on: with the restore's verdict, or with None when it failed (each rank
        then stops with an error at its gate)."""
        data = verdict.to_line() if verdict is not None else b""
        with self.gate_lock:
            for fd in self.gates.values():
                with contextlib.suppress(BrokenPipeError):  # that rank has exited already
                    os.write(fd, data)
                os.close(fd)
            self.gates.clear()
        if self.watchdog:
            self.watchdog.arm()

    def plan(self, folder: str) -> dict[int, Reads] | None:
        """Ask every rank, at its gate, which byte ranges its DCP load reads of the checkpoint whose
        `.metadata` is in `folder` (saved by another world size), and wait for every answer (each rank
        writes `folder/reads-R.json`). None, with a line saying why, when some rank cannot tell: it
        failed to plan, exited, was released meanwhile, or has not answered within the watchdog's
        start-up budget (no limit without a watchdog). After that the node fetches the whole checkpoint,
        and a rank that hung before its gate is the watchdog's once the ranks are released."""
        with self.gate_lock:
            if not self.gates:
                return None
            paths = {rank: os.path.join(folder, f"reads-{rank}.json") for rank in self.gates}
            for rank, fd in self.gates.items():
                with contextlib.suppress(BrokenPipeError):  # that rank has exited: seen below
                    os.write(fd, PlanRequest(folder, paths[rank]).to_line())
        deadline = time.monotonic() + self.watchdog.limits.watchdog.startup_s if self.watchdog else None
        reads: dict[int, Reads] = {}
        while True:
            for rank, path in paths.items():
                if rank not in reads and os.path.exists(path):
                    try:
                        reads[rank] = read_reads(path)
                    except ValueError as error:
                        say(f"rank {rank} cannot tell what its checkpoint load reads ({error}): fetching all of it")
                        return None
            if len(reads) == len(paths):
                return reads
            exited = [rank for rank, code in self.poll().items() if code is not None and rank not in reads]
            if exited:
                why = f"rank {exited[0]} exited"
            elif not self.gates:
                why = "the ranks were released"
            elif deadline is not None and time.monotonic() > deadline:
                why = f"ranks {sorted(set(paths) - set(reads))} did not answer within the start-up budget"
            else:
                time.sleep(PLAN_POLL_S)
                continue
            say(f"{why} before every rank said what its checkpoint load reads: fetching all of it")
            return None

    def release_after(self, restore: Callable[[], RestoreVerdict]) -> None:
        """Run `restore` (in a thread) while the ranks start, then :meth:`release` them with its
        verdict. If a rank fails first, the restore is abandoned and the ranks are released with
        None (:meth:`wait` then reports that rank). If `restore` raises, the ranks are released
        with None and killed, and the error is raised here."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["verdict"] = restore()
            except BaseException as error:  # noqa: BLE001  handed to the caller below
                outcome["error"] = error

        worker = threading.Thread(target=run, name="checkpoint-restore", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(POLL_S)
            if worker.is_alive() and (failure := first_failure(self.poll())):
                self._note_failure(failure)
                say(f"rank {failure[0]} exited with code {failure[1]} during the checkpoint restore: abandoning it")
                self.release(None)
                return
        if "error" in outcome:
            self.release(None)
            self.kill()
            raise outcome["error"]
        self.release(outcome["verdict"])

    def _note_failure(self, failure: tuple[int, int]) -> None:
        if self.failed_first is None:
            self.failed_first = {"rank": failure[0], "exit_code": failure[1],
                                 "time": self.exit_times.get(failure[0], time.time())}
            self.on_failure()

    def signal_all(self, signum: int) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signum)

    def stop(self) -> None:
        """SIGTERM the ranks still running, SIGKILL what is left after a grace period."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while (left := deadline - time.monotonic()) > 0 and (running := self._running_pids()):
            wait_for_exit(running, min(POLL_S, left))
        self.kill()

    def kill(self) -> None:
        """SIGKILL the ranks still running (those not started or released yet too) and reap them."""
        with self.gate_lock:
            for fd in [*self.starts.values(), *self.gates.values()]:
                os.close(fd)
            self.starts.clear()
            self.gates.clear()
        self.signal_all(signal.SIGKILL)
        for process in self.processes.values():
            process.wait()

    def poll(self) -> dict[int, int | None]:
        """Each rank's exit code, None while it runs."""
        return {rank: process.poll() for rank, process in self.processes.items()}

    def _running_pids(self) -> list[int]:
        """The pids of the ranks still running."""
        return [process.pid for process in self.processes.values() if process.poll() is None]

    def wait(self, on_hang: Callable[[Hang], None] = lambda hang: None) -> dict[int, int]:
        """Wait for every rank; on the first failure stop the others, on a hang (:meth:`_hung`) kill them.
        Returns each rank's exit code."""
        while not (failure := first_failure(codes := self.poll())):
            if all(code is not None for code in codes.values()):
                return codes  # type: ignore[return-value]
            running = {rank for rank, code in codes.items() if code is None}
            if self.watchdog and (late := self.watchdog.overdue({rank: self.processes[rank].pid for rank in running})):
                return self._hung(late, running, on_hang)
            wait_for_exit([self.processes[rank].pid for rank in running], POLL_S)  # a rank's exit is heard at once
        self._note_failure(failure)
        say(f"rank {failure[0]} exited with code {failure[1]}; stopping the node's other ranks")
        self.stop()
        return {rank: process.wait() for rank, process in self.processes.items()}


    def _hung(self, late: list[int], running: set[int], on_hang: Callable[[Hang], None]) -> dict[int, int]:
        """Name the node's culprit at once, dump the stacks, name it again with them (`on_hang` writes it down; the
        first view too when the stacks take over `FIRST_VIEW_S`: srun may end this supervisor, SIGTERM then SIGKILL
        after Slurm's KillWait, when another node exits first), wait for the other nodes' reports
        (Watchdog.wait_for_peers) unless the culprit was found stopped, kill the ranks. One report where the stacks
        come quickly (py-spy: ~50 ms for a node's ranks): every node of a hang writes it within the same second."""
        assert self.watchdog is not None
        now = time.time()
        pids = {rank: self.processes[rank].pid for rank in sorted(running)}
        self.hang = self.watchdog.first_view(pids, now)
        say(f"watchdog: rank(s) {','.join(map(str, late))} made no progress within the budget: hang of rank "
            f"{self.hang.rank} at step {self.hang.step} ({self.hang.phase}, no progress for "
            f"{now - self.hang.since:.0f} s, budget {self.hang.budget_s:.0f} s, state {self.hang.state})")
        self.on_failure()
        first_view = threading.Timer(FIRST_VIEW_S, on_hang, (self.hang,))
        first_view.start()
        try:
            self.hang = self.watchdog.investigate(pids, now)
        finally:
            first_view.cancel()
            first_view.join()  # its report, if it was due, is written before this one
            on_hang(self.hang)  # with the stacks; the first view when taking them failed
        if self.hang.rank not in self.watchdog.late_stopped:  # a stopped culprit: no other node's view is stronger
            self.watchdog.wait_for_peers()
        self.kill()
        return {rank: process.wait() for rank, process in self.processes.items()}


def node_exit_code(rank_codes: dict[int, int]) -> int:
    """The node's verdict: a failure's code (signals as 128+N), else 75 if any rank checkpointed to stop, else 0."""
    failures = [code for code in rank_codes.values() if code not in (0, ExitCode.PREEMPTED)]
    if failures:
        code = failures[0]
        return code if code > 0 else 128 - code
    return ExitCode.PREEMPTED if ExitCode.PREEMPTED in rank_codes.values() else 0


class NodeSupervisor:
    """Picklable callable that submitit runs once on every node."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.stop_file: Path | None = None
        self.terminated = False  # Slurm sent SIGTERM: the job may have lost its batch host (node.supervisor.batch_host)
        self.ranks: RankGroup | None = None
        self.watchdog: Watchdog | None = None
        self.memory: NodeMemory | None = None
        self.awaiting_word = False  # a step started ahead, waiting for the batch shell's word (node.batch.ahead)
        self.signalled_ahead = False  # a stop signal came meanwhile: the step ends without training
        self.attempt_dir: HeldFolder | None = None  # the attempt's folder, held for life: reports, heartbeat, verdicts
        self.node = 0
        self.first_written: float | None = None  # the time of this node's first report of the attempt
        self.beat_at_failure: batch_host.BeatMark | None = None  # the batch shell's heartbeat when the ranks failed
        self.presence: presence.Presence | None = None  # held for life: a step started ahead waits for its end

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Leave the stop file (read by ranks that start or run later) and pass the signal on; but a SIGTERM that
        comes after another node reported a failure is srun ending the step (a task of it failed): the ranks are
        killed at once, where a save asked for would wait for the dead node's ranks until Slurm's KillWait (30 s by
        default) ran out. Their report follows as after any failure; the attribution blames the first."""
        name = signal.Signals(signum).name
        if self.awaiting_word:  # the job stops or ends: this step, started ahead, has nothing to save
            self.signalled_ahead = True
            return
        self.terminated = self.terminated or signum == signal.SIGTERM
        if signum == signal.SIGTERM and self.ranks and self.attempt_dir and \
                (other := failed_elsewhere(self.attempt_dir, self.node)) is not None:
            say(f"got SIGTERM after node {other}'s failure (srun ends the step): the ranks are killed now, a save "
                "could not complete without that node's ranks")
            self.ranks.signal_all(signal.SIGKILL)  # not kill(): it takes the gate lock the main thread may hold
            return
        if self.stop_file and not self.stop_file.exists():
            say(f"got {name}: the ranks checkpoint at the end of this step, then stop")
            self.stop_file.parent.mkdir(parents=True, exist_ok=True)
            self.stop_file.write_text(name)
        if self.ranks:
            self.ranks.signal_all(signum)
        if self.memory and signum == signal.SIGUSR2:  # a preemption or the time limit: the run saves to the store
            self.memory.discard()  # and requeues; memory dies with the allocation (SIGTERM may be srun's, on a failure)

    def __call__(self) -> None:
        spec, env = self.spec, dict(os.environ)
        job_id = env["SLURM_JOB_ID"]
        attempt = int(env.get(envvars.ATTEMPT_INDEX) or env.get("SLURM_RESTART_COUNT", "0"))
        job_dir, argv = spec.resolve(job_id)
        self.attempt_dir = attempt_dir = HeldFolder(run_folder.attempt_folder(job_dir, attempt))
        self.node = int(env.get("SLURM_NODEID", "0"))
        try:
            rdzv = rendezvous.from_slurm_env(env, spec.procs_per_node, spec.port_window,
                                             read_ephemeral_range())
        except rendezvous.RendezvousError as error:
            say(f"ERROR before training: {error}")
            self._finish(1, {})
        self.node = rdzv.node_rank
        self.presence = presence.Presence(job_dir, attempt, rdzv.node_rank)  # for the next attempt's step ahead
        self.stop_file = run_folder.stop_file(job_dir, attempt, rdzv.node_rank)
        take_stop_signals(self._on_signal)  # replaces submitit's handlers: every rank must join the save
        if env.get(envvars.STANDBY):  # its ranks' import yields to the training beside it; adopted, they leave
            lower_session_priority(BACKGROUND_NICE)  # the session (rank.entry), this supervisor stays in it
        first = rdzv.node_rank * rdzv.procs_per_node
        say(f"node {rdzv.node_rank}/{rdzv.num_nodes} of job {job_id} attempt {attempt}: master "
            f"{rdzv.master_addr}:{rdzv.master_port}, world size {rdzv.world_size}, "
            f"ranks {first}..{first + rdzv.procs_per_node - 1}, device {spec.device}")
        env |= envvars.RankAttemptEnv(job_dir, envvars.attempt_id(job_id, attempt), self.stop_file).to_env()
        restoring = bool(spec.checkpoint and spec.checkpoint.remote)
        if spec.checkpoint:
            env |= spec.checkpoint.rank_env(job_id)
        timing = TimingReport(job_dir, attempt, rdzv.node_rank, rdzv.hosts[rdzv.node_rank])
        self.watchdog = watchdog = Watchdog(spec.watchdog, list(range(first, first + rdzv.procs_per_node)), job_dir,
                                            attempt, learns=rdzv.node_rank == 0, say=say, node=rdzv.node_rank,
                                            nodes=rdzv.num_nodes, timing=timing) if spec.watchdog else None
        # the ranks import torch and torchtitan while the node waits for the word (a step started ahead) and runs
        # its preflight; they train once started, below
        self.ranks = RankGroup(argv, env, rdzv, job_dir, gated=restoring, watchdog=watchdog,
                               on_failure=self._mark_beat)
        if remote := (spec.checkpoint.remote_for(job_id) if spec.checkpoint else None):
            threading.Thread(target=restore.import_store_library, args=(remote,), name="store-import",
                             daemon=True).start()
        if (follows := env.get(envvars.STARTED_AHEAD)) is not None:
            self._wait_for_word(attempt_dir, rdzv, job_dir, int(follows))
        if rdzv.node_rank == 0:
            history.append_event(job_dir, "start", attempt, hosts=list(rdzv.hosts))
        doctor_warnings = []
        if spec.preflight:
            try:
                doctor_warnings = run_preflight(job_dir, attempt, rdzv.node_rank, rdzv.num_nodes,
                                         spec.preflight.for_job(lambda text: spec.fill(text, job_id)))
            except PreflightFailed as failure:  # the same table on every node
                say(f"ERROR before training: {failure}")
                self._finish(ExitCode.PREFLIGHT, {})
            if doctor_warnings:
                say(f"preflight warnings (training goes on):\n{format_table(doctor_warnings)}")
        short = [w for w in doctor_warnings if w.check == MEMORY_CHECK]  # checkpoint.memory.required: false
        if short:
            say("WARNING: RAM tier off for this attempt, the run goes on store-only: too little memory "
                f"({short[0].found}; {short[0].expected})")
        self.memory = memory = self._memory(job_id, rdzv, job_dir, attempt) if restoring and not short else None
        self.ranks.start(memory.rank_env() if memory else {})
        if restoring:  # while the ranks build the model
            self._restore(job_id, rdzv, attempt_dir.sub(run_folder.RESTORE_VERDICTS), memory)
        if memory:
            memory.start_replicating()
        try:
            rank_codes = self.ranks.wait(on_hang=lambda hang: self._report(ExitCode.HANG, {}, None, hang))
        finally:
            if watchdog:
                watchdog.close()
        hang = self.ranks.hang
        code = ExitCode.HANG if hang else node_exit_code(rank_codes)
        self._conclude(code, rank_codes, self.ranks.failed_first, hang)  # the batch shell decides from it at once
        if memory:  # kept for the next attempt after a failure; gone when the ranks finished or stopped to requeue
            memory.close(keep=code not in (0, ExitCode.PREEMPTED))
        if self.terminated:
            lost = batch_host.requeue_orphaned(job_id)
        elif code not in (0, ExitCode.PREEMPTED):
            lost = batch_host.requeue_if_batch_shell_gone(attempt_dir, job_id,
                                                          self.beat_at_failure or batch_host.mark_beat(attempt_dir),
                                                          os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                                                          rdzv.num_nodes)
        else:
            lost = None
        if lost:
            say(f"the job's batch host {lost} is lost: requeued the job from this node")
            history.append_event(job_dir, "end", attempt, exit_code=None, reason="failed", action="requeue",
                                 cause=f"node {lost} lost (the batch host)", culprit=lost, excluded=[])
        self._exit(code)

    def _wait_for_word(self, attempt_dir: HeldFolder, rdzv: rendezvous.Rendezvous, job_dir: Path, follows: int) -> None:
        """In a step the batch shell started ahead of its decision (node.batch.ahead), while the ranks import: wait for
        the supervisor of attempt `follows` on this node to end (node.supervisor.presence: however long it trains),
        then for the batch shell's word (run_folder.AHEAD_WORD), and go on as this attempt, or end the step without a
        report (the batch shell ends the attempt otherwise, a stop signal came, a rank of this step ended while it
        waited, or no word came within WORD_WAIT_S). A step that ended is not taken: the restart starts its own."""
        assert self.ranks is not None
        ranks = self.ranks
        self.awaiting_word = True

        def ended() -> bool:  # a stop signal, or a rank gone before any word (killed, out of memory, a failed import)
            return self.signalled_ahead or any(code is not None for code in ranks.poll().values())

        presence.wait_gone(job_dir, follows, rdzv.node_rank, stop=ended)
        deadline = time.monotonic() + WORD_WAIT_S
        go = False
        waits = poll_waits(rdzv.num_nodes, first=WORD_POLL_S, cap=WORD_POLL_S)  # within the job folder's budget
        while not self.signalled_ahead and time.monotonic() < deadline:
            try:
                go = bool(json.loads(attempt_dir.read_text(run_folder.AHEAD_WORD))["go"])
                break  # told to go, a rank that ended meanwhile fails the attempt the usual way, with a report
            except (OSError, ValueError, KeyError, TypeError):  # not written yet (or being written: it is replaced)
                if ended():
                    break
                time.sleep(next(waits))
        self.awaiting_word = False  # a stop signal from here on takes the usual way (the stop file, the ranks)
        if self.signalled_ahead:  # came before that, even after the word: this node does not train
            go = False
        if not go:
            say("started ahead, not needed or not fit (the batch shell's word was to end, a stop signal came, a rank "
                f"of this step ended: {ranks.poll()}, or no word came within {WORD_WAIT_S:.0f} s): no rank trained")
            ranks.kill()
            if self.watchdog:
                self.watchdog.close()
            sys.exit(0)
        say("started ahead: the batch shell's word came, the ranks' import began before it")

    def _memory(self, job_id: str, rdzv: rendezvous.Rendezvous, job_dir: Path, attempt: int) -> NodeMemory | None:
        """This node's RAM tier (checkpoint.memory), serving and published before its ranks start; None when off.
        A memory folder that cannot be made ends the node when the tier is required, else the run goes on
        store-only with a warning."""
        checkpoint = self.spec.checkpoint
        if checkpoint is None or checkpoint.memory is None:
            return None
        try:
            requeue = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
            memory = NodeMemory(checkpoint.memory, job_id=job_id, requeue=requeue,
                                run=f"{job_id}:{checkpoint.config_digest}", world_size=rdzv.world_size,
                                node=rdzv.node_rank, nodes=rdzv.num_nodes, procs_per_node=rdzv.procs_per_node,
                                job_dir=job_dir, attempt=attempt, host=rdzv.hosts[rdzv.node_rank], say=say)
            memory.publish()
        except OSError as error:
            if checkpoint.memory.required:
                say(f"ERROR before training: RAM tier (checkpoint.memory.dir {checkpoint.memory.dir}): {error}")
                self._finish(ExitCode.PREFLIGHT, {})
            say(f"WARNING: RAM tier off (checkpoint.memory.required is false): {checkpoint.memory.dir}: {error}")
            return None
        return memory

    def _restore(self, job_id: str, rdzv: rendezvous.Rendezvous, verdicts: HeldFolder,
                 memory: NodeMemory | None) -> None:
        """Restore this node's share of the newest complete checkpoint (its ranks' reads: from the commit
        record, or from the ranks themselves on another world size), agreeing with the other nodes through
        `verdicts` (a folder of the attempt's, held for the supervisor's life: an abandoned restore's thread may
        still use it) before any rank loads it."""
        checkpoint, ranks = self.spec.checkpoint, self.ranks
        assert checkpoint is not None and ranks is not None
        local = self.spec.fill(checkpoint.local, job_id)
        first = rdzv.node_rank * rdzv.procs_per_node
        node_ranks = list(range(first, first + rdzv.procs_per_node))
        try:  # a failed restore kills the ranks: they have trained nothing yet
            ranks.release_after(lambda: restore.restore(checkpoint, local, job_id, rdzv.world_size, say,
                                                       ranks=node_ranks, node=rdzv.node_rank, nodes=rdzv.num_nodes,
                                                       verdicts=verdicts, planner=ranks.plan, memory=memory))
        except (SlurmTitanError, OSError) as error:
            say(f"ERROR before training: node {rdzv.node_rank}: checkpoint restore: {error}")
            self._finish(ExitCode.STORAGE_UNREACHABLE, {})

    def _mark_beat(self) -> None:
        """Note the batch shell's heartbeat as this node's first rank failure or its hang is seen
        (batch_host.mark_beat)."""
        assert self.attempt_dir is not None
        self.beat_at_failure = batch_host.mark_beat(self.attempt_dir)

    def _report(self, code: int, rank_codes: dict[int, int], failed_first: dict[str, float | int] | None = None,
                hang: Hang | None = None) -> None:
        """This node's report of the attempt (:func:`write_report`)."""
        assert self.attempt_dir is not None
        self.first_written = self.first_written or time.time()
        write_report(self.attempt_dir, self.node, code, rank_codes, failed_first, hang,
                     first_written=self.first_written)

    def _finish(self, code: int, rank_codes: dict[int, int], failed_first: dict[str, float | int] | None = None,
                hang: Hang | None = None) -> None:
        """:meth:`_conclude`, then :meth:`_exit`."""
        self._conclude(code, rank_codes, failed_first, hang)
        self._exit(code)

    def _conclude(self, code: int, rank_codes: dict[int, int], failed_first: dict[str, float | int] | None = None,
                  hang: Hang | None = None) -> None:
        """Kill the ranks still there (those that never trained: ended before the word to start) and write the node's
        report (:meth:`_report`), unless it is a hang's: that one was written as it was seen (`RankGroup.wait`'s
        `on_hang`; the ranks' codes, the kill's, would add nothing that anyone reads, and every node of a hang would
        write once more at the same moment)."""
        if self.ranks:
            self.ranks.kill()
        if self.watchdog:
            self.watchdog.close()
        if hang is None:
            self._report(code, rank_codes, failed_first)

    def _exit(self, code: int) -> None:
        """Say the node is done; exit non-zero only on failure."""
        say(f"node done: exit code {code}" + (" (checkpointed to stop)" if code == ExitCode.PREEMPTED else ""))
        if code not in (0, ExitCode.PREEMPTED):
            sys.exit(code)
