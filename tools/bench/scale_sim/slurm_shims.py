"""Slurm's commands as shims for the scale harness's Slurm part (:mod:`.slurm`): `srun`, `scontrol`, `squeue` and
`sacct` that answer from a scenario, log every call, serialize step creation and can delay it.

:func:`install` writes one executable a command into a bin folder that :func:`environment` puts first on PATH;
each runs :func:`main` with the interpreter that wrote it (``-S``: no site, a fast start; this module imports
nothing of slurm_titan, it stands for Slurm). Their state folder ($SCALE_SIM_SLURM) holds ``cluster.json`` (the
:class:`Cluster`), ``calls.jsonl`` (a line at each call's start, and one at its end however it ended, from a forked
watcher: :func:`read_calls`), the step lock and the step counter.

- ``srun``: creates one step at a time (slurmctld's job lock), each after $SCALE_SIM_STEP_CREATION_S, then prints
  what ``srun -v`` prints once the step exists ("srun: launching StepId=<job>.<step> on host <node>, 1 tasks: <i>",
  as recorded on the bundled cluster) and runs its command once for each live node of ``--nodelist``
  (SLURMD_NODENAME set). A dead node starts no task: after $SCALE_SIM_LAUNCH_FAIL_S (MessageTimeout, 10 s by
  default) srun says the launch failed and exits 1, as it does when a node's slurmd does not answer.
- ``scontrol``: ``show job -o [ID]``, ``show node -o NODES`` (every node ALLOCATED: the scenarios end long
  before SlurmdTimeout marks a dead node down), ``requeue ID`` (the first one wins, as a requeued job is pending)
  and ``update``.
- ``sacct -j IDS -o FIELDS`` (``-P``: ``|``-separated) and ``squeue`` (the default columns), from the jobs.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

COMMANDS = ("srun", "scontrol", "squeue", "sacct")
STATE = "SCALE_SIM_SLURM"
CREATION_S = "SCALE_SIM_STEP_CREATION_S"
LAUNCH_FAIL_S = "SCALE_SIM_LAUNCH_FAIL_S"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Job:
    """A job as Slurm knows it; `forgotten`: only accounting (sacct) still knows it; `ends_at`: it is COMPLETED
    from then on (time.time())."""

    id: str
    state: str
    nodes: list[str]
    batch_host: str = ""
    forgotten: bool = False
    ends_at: float | None = None

    def state_now(self) -> str:
        return "COMPLETED" if self.ends_at is not None and time.time() >= self.ends_at else self.state


@dataclass
class Cluster:
    """The scenario: the job whose steps srun creates, the nodes that start no task, every job Slurm knows."""

    job_id: str
    dead: list[str] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    def write(self, state: Path) -> None:
        state.mkdir(parents=True, exist_ok=True)
        (state / "cluster.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, state: Path) -> Cluster:
        data = json.loads((state / "cluster.json").read_text())
        return cls(data["job_id"], data["dead"], [Job(**job) for job in data["jobs"]])


@dataclass(frozen=True)
class Call:
    """One line of the call log."""

    cmd: str
    argv: list[str]
    pid: int
    t: float
    event: str  # start | end


def install(bin_dir: Path) -> Path:
    """Write the shims into `bin_dir`; returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                        "from tools.bench.scale_sim.slurm_shims import main\nsys.exit(main())\n")
        path.chmod(0o755)
    return bin_dir


def environment(bin_dir: Path, path: str, state: Path, creation_s: float, launch_fail_s: float) -> dict[str, str]:
    """The variables that make the shims in `bin_dir` Slurm (before `path`, the PATH without them), with
    `state`'s scenario and those delays."""
    return {"PATH": f"{bin_dir}{os.pathsep}{path}", STATE: str(state), CREATION_S: str(creation_s),
            LAUNCH_FAIL_S: str(launch_fail_s)}


def read_calls(state: Path) -> list[Call]:
    """Every call logged so far, in order."""
    path = state / "calls.jsonl"
    return [Call(**json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []


def starts(calls: list[Call], *cmds: str) -> int:
    """How many calls of `cmds` started."""
    return sum(1 for call in calls if call.event == "start" and call.cmd in cmds)


def most_in_flight(calls: list[Call], cmd: str) -> int:
    """The most calls of `cmd` running at once (one without an end line yet still runs)."""
    running: set[int] = set()
    most = 0
    for call in sorted((c for c in calls if c.cmd == cmd), key=lambda c: c.t):
        if call.event == "start":
            running.add(call.pid)
        else:
            running.discard(call.pid)
        most = max(most, len(running))
    return most


def _log(state: Path, cmd: str, argv: list[str], event: str, pid: int) -> None:
    line = json.dumps(asdict(Call(cmd, argv, pid, time.time(), event))) + "\n"
    fd = os.open(state / "calls.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _create_step(state: Path) -> int:
    """The next step's number, created under the lock after the configured delay."""
    with _locked(state / "step.lock"):
        time.sleep(float(os.environ.get(CREATION_S, "0")))
        counter = state / "steps"
        step = int(counter.read_text()) + 1 if counter.is_file() else 0
        counter.write_text(str(step))
    return step


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """srun's `--name=value` options (flags map to "") and the command after them."""
    options: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if not arg.startswith("-"):
            return options, argv[index:]
        name, _, value = arg.lstrip("-").partition("=")
        options[name] = value
    return options, []


def srun(argv: list[str], cluster: Cluster, state: Path) -> int:
    options, command = _options(argv)
    hosts = options["nodelist"].split(",")
    step = _create_step(state)
    stamp = f"{cluster.job_id}.{step}"
    print(f"srun: jobid {cluster.job_id}: nodes({len(hosts)}):`{','.join(hosts)}', cpu counts: 1(x{len(hosts)})",
          file=sys.stderr, flush=True)
    for index, host in enumerate(hosts):
        print(f"srun: launching StepId={stamp} on host {host}, 1 tasks: {index}", file=sys.stderr, flush=True)
    for index, host in enumerate(hosts):
        if host not in cluster.dead:
            subprocess.run(command, env=os.environ | {"SLURMD_NODENAME": host, "SLURM_NODEID": str(index),
                                                      "SLURM_PROCID": str(index), "SLURM_STEP_ID": str(step)})
    dead = [host for host in hosts if host in cluster.dead]
    if not dead:
        return 0
    time.sleep(float(os.environ.get(LAUNCH_FAIL_S, "10")))
    for host in dead:
        print(f"srun: error: Task launch for StepId={stamp} failed on node {host}: Socket timed out on send/recv "
              "operation", file=sys.stderr)
    print("srun: error: Application launch failed: Socket timed out on send/recv operation", file=sys.stderr)
    return 1


def _job_line(job: Job) -> str:
    return (f"JobId={job.id} JobName=sim JobState={job.state_now()} Reason=None Requeue=1 Restarts=0 BatchFlag=1 "
            f"ExitCode=0:0 StartTime={time.strftime('%Y-%m-%dT%H:%M:%S')} TimeLimit=1-00:00:00 "
            f"NodeList={','.join(job.nodes)} BatchHost={job.batch_host} NumNodes={len(job.nodes)}")


def scontrol(argv: list[str], cluster: Cluster, state: Path) -> int:
    words = [arg for arg in argv if arg != "-o"]
    known = {job.id: job for job in cluster.jobs if not job.forgotten}
    if words[:2] == ["show", "job"]:
        if words[2:] and words[2] not in known:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        print("\n".join(_job_line(job) for job in known.values() if not words[2:] or job.id == words[2]))
        return 0
    if words[:2] == ["show", "node"]:
        print("\n".join(f"NodeName={node} Arch=x86_64 CPUTot=8 State=ALLOCATED Partitions=sim"
                        for node in words[2].split(",")))
        return 0
    if words[:1] == ["requeue"]:
        try:
            os.close(os.open(state / f"requeued-{words[1]}", os.O_CREAT | os.O_EXCL))
            return 0
        except FileExistsError:
            print(f"scontrol: error: Job is pending execution for job {words[1]}", file=sys.stderr)
            return 1
    if words[:1] == ["update"]:
        return 0
    print(f"scontrol: error: the shim does not know {' '.join(argv)}", file=sys.stderr)
    return 1


def sacct(argv: list[str], cluster: Cluster, state: Path) -> int:
    ids = argv[argv.index("-j") + 1].split(",")
    fields = argv[argv.index("-o") + 1].split(",")
    for job in cluster.jobs:
        if job.id in ids:
            values = {"JobIDRaw": job.id, "JobID": job.id, "State": job.state_now(), "Reason": "None",
                      "NodeList": ",".join(job.nodes), "ExitCode": "0:0"}
            print("|".join(values.get(name, "") for name in fields))
    return 0


def squeue(argv: list[str], cluster: Cluster, state: Path) -> int:
    print("JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)")
    for job in cluster.jobs:
        if not job.forgotten and job.state_now() in ("RUNNING", "PENDING"):
            print(f"{job.id} sim sim user {job.state_now()[0]} 0:00 {len(job.nodes)} {','.join(job.nodes)}")
    return 0


def _log_end(state: Path, cmd: str, argv: list[str]) -> None:
    """Fork a watcher that logs this call's end once this process has ended, however it ended (the probe kills
    srun as soon as every node answered)."""
    pid = os.getpid()
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(write)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the caller's pipes must not wait for this one
            os.dup2(devnull, fd)
        os.read(read, 1)  # end of file: every copy of the write end, this call's only, is closed
        _log(state, cmd, argv, "end", pid)
        os._exit(0)
    os.close(read)


def main() -> int:
    cmd, argv, state = Path(sys.argv[0]).name, sys.argv[1:], Path(os.environ[STATE])
    _log(state, cmd, argv, "start", os.getpid())
    _log_end(state, cmd, argv)
    handler = {"srun": srun, "scontrol": scontrol, "squeue": squeue, "sacct": sacct}[cmd]
    return handler(argv, Cluster.read(state), state)
