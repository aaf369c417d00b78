"""The next attempt's srun step, started ahead of the batch shell's decision (runs in the batch shell).

A restart inside the allocation waits for the failed step to end on every node, for `finish` to conclude, then
for a new srun step, whose ranks spend seconds importing torch and torchtitan before they train (4-5 s of a
10.7 s restart on the bundled cluster). So the step watcher starts the next attempt's step on the same nodes ahead
(:func:`start_ahead`): once it sees a node report a failure, or, with `preemption.standby_step`, as soon as the
attempt trained its first step (a standby step: the import is then done before any failure). Each node's supervisor
starts its ranks, which import and then wait (rank.start_gate); it waits itself for the supervisor of the attempt
it follows on its node to end (node.supervisor.presence: no lookup of the job folder while that attempt trains),
then for the batch shell's word (run_folder.AHEAD_WORD). The step's attempt number is claimed as it starts (the
next free one: `finish` numbers the restart with it). When `finish` restarts on those nodes, it tells the step to go
(:func:`step_for`); otherwise (other nodes, a requeue, the end) it tells it to end and kills its srun
(:func:`dismiss`): its ranks trained nothing, its supervisors wrote no report. The srun is the starting process's
child: a thread there records its exit code in the folder of the attempt it was started during
(run_folder.AHEAD_EXIT), where `finish` reads it, whichever process started it.

The first attempt's watcher is a process of its own, which may be starting a step as the batch shell decides: a
step started and recorded, and the decision's look for it and its mark that the attempt is decided
(:func:`decide`, run_folder.AHEAD_CLOSED), each happen whole under one lock, so that the decision finds every step
started ahead of it, and none starts after it (a step nobody looks for would wait out its word's budget). The lock
is an abstract Unix socket's name on the batch host (both run there; a shared file system's flock is not everywhere,
and a lock file in /tmp would outlive a job cancelled outright).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_titan import envvars
from slurm_titan.node.batch.allocation import AttemptPlan, next_attempt_number
from slurm_titan.node.batch.processes import alive, command
from slurm_titan.records import run_folder
from slurm_titan.records.whole_file import replace_text

EXIT_POLL_S = 0.5
EXIT_GRACE_S = 10.0  # after its srun is gone, how long its exit code may take to be written
LOCK_POLL_S = 0.005  # how often a process waiting for the job's lock tries again (it is held for milliseconds)


def _running(pid: int) -> bool:
    """Whether `pid` is still the step's srun (or the shell about to exec it), not ended: a zombie has ended, and
    another process that took the pid since is not it."""
    return alive(pid) and command(pid) in ("srun", "bash")


def start_srun(job_dir: Path, job_id: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """An attempt's srun step: submitit's command block (:func:`srun_command`) with `env` (the attempt's plan in it)."""
    return subprocess.Popen(["bash", "-c", srun_command(job_dir, job_id)], env=env)


def srun_command(job_dir: Path, job_id: str) -> str:
    """submitit's command block from the job's own submission script (run again for each attempt after the first):
    from its `# command` marker to its `# teardown` marker (the environment it exports, then srun, whose command
    spans several lines on an NPU job), srun exec'ed so that the shell's pid is srun's."""
    script = run_folder.submission_script(job_dir, job_id)
    text = script.read_text()
    start = text.find("\n# command\n")
    srun = text.find("\nsrun ", start)
    end = text.find("\n# teardown", srun)
    if min(start, srun, end) < 0:
        raise RuntimeError(f"{script} has no srun command between '# command' and '# teardown'")
    return f"{text[start + len('# command') + 2:srun + 1]}exec {text[srun + 1:end].strip()}"


def lock_name(job_dir: Path) -> bytes:
    """The abstract Unix socket name (Linux) whose binding is the lock of the job's steps started ahead: nothing on
    any disk, released when its holder's socket closes, or its process dies, however the job ends."""
    return b"\0slurm-titan-ahead-" + hashlib.sha256(bytes(job_dir)).hexdigest()[:16].encode()


@contextlib.contextmanager
def job_lock(job_dir: Path) -> Iterator[None]:
    """Hold the lock of the job's steps started ahead (any process or thread of the batch host waits for it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        while True:
            try:
                holder.bind(lock_name(job_dir))
                break
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                time.sleep(LOCK_POLL_S)
        yield


def decide(job_dir: Path, during: int) -> AheadStep | None:
    """Mark attempt `during` decided (no step is started ahead during it after this) and return the step that was,
    if any (:func:`find`)."""
    with job_lock(job_dir):
        with contextlib.suppress(OSError):  # no folder: no step could record itself there either
            replace_text(run_folder.attempt_folder(job_dir, during) / run_folder.AHEAD_CLOSED, "")
        return find(job_dir, during)


def start_ahead(job_dir: Path, job_id: str, during: int, nodes: tuple[str, ...], env: Mapping[str, str],
                standby: bool = False) -> threading.Thread | None:
    """Start the step of the attempt after `during` on `nodes` ahead of the decision, its number claimed now (the next
    free one); returns the thread that records its srun's exit code (the starting process waits for it before it
    exits: the srun is its child), or None when the batch shell decided already what follows `during`. A `standby`
    step (`during` trains) has its ranks import at the background priority (envvars.STANDBY)."""
    folder = run_folder.attempt_folder(job_dir, during)
    with job_lock(job_dir):
        if (folder / run_folder.AHEAD_CLOSED).exists():
            return None
        plan = AttemptPlan(next_attempt_number(job_dir), nodes)
        (folder / run_folder.AHEAD_EXIT).unlink(missing_ok=True)  # a standby step's that ended before (this one's)
        srun = start_srun(job_dir, job_id, {**env, **plan.env(), envvars.STARTED_AHEAD: str(during),
                                            **({envvars.STANDBY: "1"} if standby else {})})
        try:
            replace_text(folder / run_folder.AHEAD, json.dumps({"attempt": plan.attempt, "pid": srun.pid,
                                                                 "nodes": list(nodes)}))
        except OSError:
            srun.kill()  # a step nobody can find would wait for a word that never comes
            srun.wait()
            raise

    def record() -> None:
        code = srun.wait()
        with contextlib.suppress(OSError):  # the job folder is gone: nobody is left to read it
            replace_text(folder / run_folder.AHEAD_EXIT, str(code))

    recorder = threading.Thread(target=record, name="srun-started-ahead", daemon=False)
    recorder.start()
    return recorder


@dataclass(frozen=True)
class AheadStep:
    """The step started ahead during an attempt, as `finish` finds it."""

    folder: Path  # the folder of the attempt during which it was started
    attempt: int  # its own attempt's number
    pid: int
    nodes: tuple[str, ...]

    def exit_code(self) -> int | None:
        """Its srun's exit code once it ended, else None."""
        try:
            return int((self.folder / run_folder.AHEAD_EXIT).read_text())
        except (OSError, ValueError):
            return None

    def tell(self, go: bool) -> None:
        """The batch shell's word to the step's supervisors."""
        replace_text(self.folder.parent / str(self.attempt) / run_folder.AHEAD_WORD, json.dumps({"go": go}))

    def wait(self) -> int:
        """Until its srun ended; its exit code (1 when it ended without one written: its recorder could not)."""
        ended_at = None
        while (code := self.exit_code()) is None:
            if _running(self.pid):
                ended_at = None
            elif ended_at is None:
                ended_at = time.monotonic()
            elif time.monotonic() - ended_at > EXIT_GRACE_S:
                return 1
            time.sleep(EXIT_POLL_S)
        return code


def find(job_dir: Path, during: int) -> AheadStep | None:
    """The step started ahead during attempt `during`, None when none was (or its record does not read)."""
    folder = run_folder.attempt_folder(job_dir, during)
    try:
        data = json.loads((folder / run_folder.AHEAD).read_text())
        return AheadStep(folder, int(data["attempt"]), int(data["pid"]), tuple(str(node) for node in data["nodes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def step_for(job_dir: Path, during: int, plan: AttemptPlan) -> AheadStep | None:
    """The step started ahead during attempt `during`, told to go, when it is `plan`'s (its number, its nodes) and
    its srun still runs; else None, that step (if any) told to end first."""
    step = find(job_dir, during)
    if step is None:
        return None
    if (step.attempt, step.nodes) != (plan.attempt, plan.nodes) or step.exit_code() is not None:
        dismiss(job_dir, during)
        return None
    step.tell(go=True)
    return step


def dismiss(job_dir: Path, during: int) -> None:
    """End the step started ahead during attempt `during`, if any: its supervisors are told, its srun killed (a node
    of it may be lost, and srun would wait for it)."""
    if (step := find(job_dir, during)) is None or step.exit_code() is not None:
        return
    with contextlib.suppress(OSError):
        step.tell(go=False)
    if _running(step.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(step.pid, signal.SIGKILL)
