"""A real multi-node Slurm cluster on this one machine: `LocalCluster` (up, down, status, env, kill nodes).

Layout: no network namespaces. All nodes share the host network and 127.0.0.1, one slurmd port each
(port+1..port+5; slurmctld on port). Each slurmd runs in its own UTS and mount namespace
(`unshare --uts --mount`), which gives it
  - its own hostname (n1..n5),
  - STATE/etc/hosts bind-mounted on /etc/hosts (n1..n5 and the controller -> 127.0.0.1),
  - STATE/etc bind-mounted on /etc/slurm (so jobs find slurm.conf even with --export=NONE),
  - STATE/nodes/nX/scratch bind-mounted on /var/tmp/slurm-titan-local (node-local disk),
  - a tmpfs of its own on /dev/shm (the node's memory: it goes with the node's last process, as a lost machine's).
Jobs run inside their node's namespaces. The host ("login node") is untouched: it only needs SLURM_CONF.
Needs root (mount namespaces), util-linux and the Debian packages slurmctld slurmd slurm-client munge
(Slurm 22.05). Standard library only: tools/setup runs `install-deps` before the venv exists.

The state folder (STATE/run/pids/*.pid, STATE/run/ns/*.ns) is the one the bash tools/local-cluster wrote, so
either can stop a cluster the other started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tools.local_cluster import procs

DEFAULT_STATE = "/var/tmp/slurm-titan-cluster"
DEFAULT_PORT = 17000
DEFAULT_TIMEOUT_S = 60
SCRATCH_MNT = Path("/var/tmp/slurm-titan-local")
NODES = ("n1", "n2", "n3", "n4", "n5")
NODE_LIST = f"n[1-{len(NODES)}]"  # NODES as a Slurm hostlist
APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
APT_LINE = "apt-get install -y --no-install-recommends " + " ".join(APT_PACKAGES)
NEEDED_BINARIES = ("slurmctld", "slurmd", "munged", "mungekey", "munge", "sinfo", "scontrol", "squeue", "srun",
                   "sbatch", "unshare")
SBIN = "/usr/sbin:/sbin"
TEMPLATES = Path(__file__).parent
USABLE_STATES = {"idle", "mix", "alloc", "comp", "plnd", "resv"}
LOCK_WAIT_S = 300
ID_CYCLE = 10_000  # slurm-titan's default master-port window (node/supervisor/rendezvous.py) spans this many job ids
SLOTS = 4  # clusters side by side (tools/test's workers): each starts its job ids in its own part of ID_CYCLE
FREEZE_ROUNDS, FREEZE_WAIT_S = 20, 5.0  # kill_node: rounds of SIGSTOP for processes forked meanwhile; wait per round
# A node: its hostname, /etc/hosts, /etc/slurm, node-local scratch and /dev/shm are private to it (mount propagation is
# private under unshare); then slurmd, in place of this shell. $1 node, $2 state, $3 scratch, $4 /etc/slurm or "".
NODE_SHELL = """
hostname "$1"
mount --bind "$2/etc/hosts" /etc/hosts
[ -z "$4" ] || mount --bind "$2/etc" "$4"
mount --bind "$2/nodes/$1/scratch" "$3"
mount -t tmpfs -o mode=1777,size=25% tmpfs /dev/shm
exec slurmd -D -N "$1" -f "$2/etc/slurm.conf"
"""


class ClusterError(Exception):
    """Why the cluster could not be brought up or down, in one line."""


@dataclass(frozen=True)
class Status:
    """What `tools/local-cluster status` prints, and its exit code: 0 healthy, 1 degraded, 3 not up."""

    code: int
    text: str


def say(message: str) -> None:
    print(f"local-cluster: {message}", file=sys.stderr, flush=True)


def search_path(env: Mapping[str, str]) -> str:
    """The PATH the cluster's commands are looked up in: the caller's, then the sbin folders (Debian puts the
    daemons there)."""
    return f"{env.get('PATH', '')}:{SBIN}"


def missing_binary(path: str) -> str | None:
    """The first program the cluster needs that `path` lacks, or None."""
    return next((name for name in NEEDED_BINARIES if shutil.which(name, path=path) is None), None)


def render(template: Path, values: Mapping[str, str]) -> str:
    """`template` with every @NAME@ replaced by values[NAME]; a placeholder left over is an error."""
    text = template.read_text().rstrip("\n")
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    left = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if left:
        raise ClusterError(f"unrendered placeholder in {template}: {' '.join(left)}")
    return text + "\n"


def node_resources(cpus: int, memory_kib: int) -> tuple[int, int]:
    """(CPUs, MB) each node advertises: no more than the machine has, or slurmd drains the node; at most 2 CPUs
    and half the memory, up to 4000 MB."""
    return min(cpus, 2), min(memory_kib // 1024 // 2, 4000)


def first_job_id(now: float, slot: int) -> int:
    """The first job id of a cluster started at `now` in `slot`: clock-derived, so that a fresh cluster does not
    reuse the ids (and log file names) of a previous one, and in the slot's own part of ID_CYCLE, so that the
    jobs of clusters side by side (one per test worker) never share an id, nor the master port slurm-titan
    derives from it (job id modulo ID_CYCLE), while each cluster has run fewer than ID_CYCLE / SLOTS jobs."""
    clock = int(now) % 10_000_000
    return clock - clock % ID_CYCLE + (clock + slot * ID_CYCLE // SLOTS) % ID_CYCLE + 1


def _memory_kib() -> int:
    meminfo = Path("/proc/meminfo").read_text()
    return int(re.search(r"^MemTotal:\s+(\d+)", meminfo, re.M).group(1))


def _port_in_use(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _whole_number(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "") or str(default)
    if not value.isascii() or not value.isdigit():
        raise ClusterError(f"{name} must be a whole number, not {value!r}")
    return int(value)


class LocalCluster:
    """The cluster whose state lives in `state`: munged, slurmctld on `port` and one slurmd per node of NODES on
    the ports after it. `up` waits `timeout_s` for the nodes. Daemons run with `env` (default: this process's),
    their commands looked up in `search_path(env)`."""

    def __init__(self, state: str | os.PathLike = DEFAULT_STATE, port: int = DEFAULT_PORT,
                 timeout_s: int = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None, slot: int = 0) -> None:
        self.state = Path(os.path.abspath(state))
        self.port, self.timeout_s, self.slot = port, timeout_s, slot
        self.path = search_path(os.environ if env is None else env)
        self.daemon_env = dict(os.environ if env is None else env, PATH=self.path)
        self._started: list[subprocess.Popen] = []  # daemons this object started: reaped once they are gone

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> LocalCluster:
        """The cluster that SLURM_TITAN_CLUSTER_DIR, _PORT, _TIMEOUT and _SLOT name (or the default one)."""
        slot = _whole_number(env, "SLURM_TITAN_CLUSTER_SLOT", 0)
        if slot >= SLOTS:
            raise ClusterError(f"SLURM_TITAN_CLUSTER_SLOT must be below {SLOTS}, not {slot}")
        return cls(env.get("SLURM_TITAN_CLUSTER_DIR") or DEFAULT_STATE,
                   _whole_number(env, "SLURM_TITAN_CLUSTER_PORT", DEFAULT_PORT),
                   _whole_number(env, "SLURM_TITAN_CLUSTER_TIMEOUT", DEFAULT_TIMEOUT_S), env, slot)

    # ---- where things are ----------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.state / "etc" / "slurm.conf"

    @property
    def run_dir(self) -> Path:
        return self.state / "run"

    @property
    def logs(self) -> Path:
        return self.state / "log"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge.socket"

    def env(self) -> dict[str, str]:
        """What points Slurm's commands (and slurm-titan) at this cluster."""
        return {"SLURM_CONF": str(self.conf), "SLURM_TITAN_CLUSTER_DIR": str(self.state)}

    def export_lines(self) -> str:
        """env() as shell export lines: `eval "$(tools/local-cluster env)"`."""
        return "\n".join(f"export {name}={value}" for name, value in self.env().items())

    # ---- processes -----------------------------------------------------------------------------------------
    @staticmethod
    def daemons() -> list[str]:
        return ["munged", "slurmctld", *(f"slurmd-{node}" for node in NODES)]

    def pid_of(self, daemon: str) -> int | None:
        """The pid recorded for `daemon` (munged, slurmctld, slurmd-nX), if it still runs as that program: a pid
        reused by another program is not mistaken for ours."""
        try:
            text = (self.run_dir / "pids" / f"{daemon}.pid").read_text().rstrip("\n")
        except OSError:
            return None
        if not re.fullmatch(r"[0-9]+", text):
            return None
        pid = int(text)
        if procs.program(pid) != daemon.split("-")[0] or not procs.is_running(pid):
            return None
        return pid

    def alive(self) -> bool:
        return all(self.pid_of(daemon) is not None for daemon in self.daemons())

    def node_path(self, node: str, path: str) -> Path | None:
        """`path` as `node` sees it (its mounts: node-local scratch, /dev/shm), from this host through its slurmd's
        root; None while the node is down."""
        pid = self.pid_of(f"slurmd-{node}")
        return None if pid is None else Path(f"/proc/{pid}/root") / path.lstrip("/")

    def node_processes(self, node: str | None = None) -> list[int]:
        """The processes living in a node's namespaces (its slurmd, slurmstepd, job tasks): of `node`, or of
        every node."""
        return procs.in_namespaces(self.node_namespaces(node))

    def node_namespaces(self, node: str | None = None) -> set[str]:
        """The namespace keys of `node` (or of every node) whose slurmd still runs in them. A node's namespaces
        end with its last process, and the kernel gives their numbers to the next namespaces made, another
        cluster's nodes' too: the key of a node that was killed may name someone else's processes by now."""
        keys = set()
        for name in [node] if node else list(NODES):
            with contextlib.suppress(OSError):
                key = (self.run_dir / "ns" / f"{name}.ns").read_text().strip()
                slurmd = self.pid_of(f"slurmd-{name}")
                if slurmd is not None and procs.namespaces(slurmd) == key:
                    keys.add(key)
        return keys

    def kill_nodes(self, *nodes: str) -> int:
        """Kill `nodes` whole, as lost machines: each one's slurmd and every process of its namespaces (slurmstepd,
        the supervisor, the ranks, their uploaders), all of them frozen before any is killed (lost together).
        Returns how many processes were killed. `up` heals the cluster (a node gone makes its state stale:
        everything starts afresh).

        A machine that is lost tells nobody, so no process of the node may see another one die: the node is
        frozen first (SIGSTOP, again for any process forked meanwhile; up to FREEZE_WAIT_S for each to show
        stopped), then killed children first. Killed one by one while running, its first dead processes were
        reported by the others: srun saw its task die and its --kill-on-bad-exit killed the job's step on
        every other node before srun died itself. Killed parents first, a dead parent left its stopped
        children's process group orphaned, and the kernel woke them with SIGHUP and SIGCONT (srun then ended
        the step too)."""
        frozen: set[int] = set()
        for _ in range(FREEZE_ROUNDS):
            present = {pid for node in nodes for pid in self.node_processes(node)}  # the last listing is killed
            if not present - frozen:
                break
            procs.send(present - frozen, signal.SIGSTOP)
            procs.wait_stopped(present - frozen, FREEZE_WAIT_S)
            frozen |= present
        return procs.send(procs.children_first(present), signal.SIGKILL)

    # ---- health ----------------------------------------------------------------------------------------------
    def _slurm(self, *args: str, timeout: float, stderr: int = subprocess.STDOUT) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster, its stderr in its stdout (or `stderr`); a command that hangs
        past `timeout` counts as failed."""
        try:
            return subprocess.run(list(args), env=self.daemon_env | {"SLURM_CONF": str(self.conf)}, text=True,
                                  stdout=subprocess.PIPE, stderr=stderr, timeout=timeout)
        except subprocess.TimeoutExpired as late:
            out = late.output.decode(errors="replace") if isinstance(late.output, bytes) else late.output or ""
            return subprocess.CompletedProcess(list(args), 124, out)

    def node_states(self) -> set[tuple[str, str]] | None:
        """{(node, state)} as sinfo sees them, or None when sinfo fails."""
        done = self._slurm("sinfo", "-h", "-N", "-o", "%N %t", timeout=10, stderr=subprocess.DEVNULL)
        if done.returncode != 0:
            return None
        return {tuple(line.split()[:2]) for line in done.stdout.splitlines() if len(line.split()) >= 2}

    def nodes_ok(self, idle: bool = False) -> bool:
        """Every node known, and idle (`idle`) or up and responding."""
        states = self.node_states()
        if states is None or len(states) != len(NODES):
            return False
        return all(state == "idle" if idle else state in USABLE_STATES for _, state in states)

    def status(self) -> Status:
        """The daemons, sinfo, and healthy or DEGRADED (code 0 or 1); code 3 when the cluster was never up."""
        if not self.conf.is_file():
            return Status(3, f"not up ({self.state})")
        lines, code = [f"state: {self.state}   conf: {self.conf}   logs: {self.logs}"], 0
        for daemon in self.daemons():
            pid = self.pid_of(daemon)
            lines.append(f"  {daemon}: running (pid {pid})" if pid else f"  {daemon}: NOT running")
            code = code or int(pid is None)
        sinfo = self._slurm("sinfo", timeout=10)
        if sinfo.stdout.strip():
            lines.append(sinfo.stdout.rstrip("\n"))
        if sinfo.returncode != 0 or (code == 0 and not self.nodes_ok()):
            code = 1
        lines.append("healthy" if code == 0 else "DEGRADED")
        return Status(code, "\n".join(lines))

    def _show_failure(self, tail_lines: int) -> None:
        """sinfo's view and the tails of the logs, on stderr: what a failed `up` leaves to read."""
        sinfo = self._slurm("sinfo", "-N", timeout=5)
        for line in sinfo.stdout.splitlines():
            print(f"  sinfo: {line}", file=sys.stderr)
        logs = [self.logs / "munged.log", self.logs / "slurmctld.log", *sorted(self.logs.glob("*.out")),
                *sorted(self.logs.glob("slurmd-*.log"))]
        for log in logs:
            if log.is_file() and log.stat().st_size:
                tail = log.read_text(errors="replace").splitlines()[-tail_lines:]
                print(f"----- tail {log}", *tail, sep="\n", file=sys.stderr)
        sys.stderr.flush()

    # ---- up ----------------------------------------------------------------------------------------------------
    def check_binaries(self) -> None:
        missing = missing_binary(self.path)
        if missing:
            raise ClusterError(f"missing '{missing}'; install: apt-get update && {APT_LINE} "
                               "(or: tools/local-cluster install-deps)")

    @staticmethod
    def need_root() -> None:
        if os.geteuid() != 0:
            raise ClusterError("must run as root (mount namespaces, slurmd)")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialize up/down from several shells at once (the daemons do not inherit the lock)."""
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / ".lock", "w") as lock:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"another tools/local-cluster up/down holds {lock.name}") from None
                    time.sleep(0.2)
            yield

    def up(self) -> None:
        """Bring the cluster up, or leave it up if it is healthy; a cluster with a daemon gone (a killed node)
        is stopped and started afresh."""
        self.check_binaries()
        self.need_root()
        with self._locked():
            if self.run_dir.is_dir():
                if self.alive():
                    self._wait_usable()
                    return
                say(f"stale state in {self.state} (some daemons are gone): cleaning it up")
                self._stop(say)
            self._start()

    def _wait_usable(self) -> None:
        if self.nodes_ok():
            say(f"already up and healthy ({self.state})")
            return
        say(f"daemons running but nodes not ready; waiting up to {self.timeout_s}s")
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            if self.nodes_ok():
                say("up")
                return
            time.sleep(1)
        self._show_failure(10)
        raise ClusterError(f"nodes not usable after {self.timeout_s}s; run 'tools/local-cluster down' then 'up'")

    def _check_state_dir(self) -> None:
        # munged refuses a socket below a directory that others cannot search (mode 0700).
        self.state.mkdir(parents=True, exist_ok=True)
        folder = Path(os.path.realpath(self.state))
        for above in [folder, *folder.parents][:-1]:
            if not above.stat().st_mode & 0o001:
                raise ClusterError("munged needs every directory above its socket to be world-searchable (o+x); "
                                   f"{above} is not: choose another SLURM_TITAN_CLUSTER_DIR")

    def _fresh_state(self) -> None:
        """An empty state folder; the logs of the previous run are replaced."""
        for part in ("etc", "run", "spool", "munge", "nodes", "log"):
            shutil.rmtree(self.state / part, ignore_errors=True)
        for folder in (self.state / "etc", self.run_dir / "pids", self.run_dir / "ns", self.state / "spool" / "ctld",
                       self.state / "munge", self.logs, SCRATCH_MNT,
                       *(self.state / "nodes" / node / "scratch" for node in NODES),
                       *(self.state / "spool" / node for node in NODES)):
            folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.state, self.run_dir, self.logs, self.state / "etc"):
            folder.chmod(0o755)
        (self.state / "munge").chmod(0o700)

    def _write_configs(self) -> None:
        cpus, memory = node_resources(len(os.sched_getaffinity(0)), _memory_kib())
        host = socket.gethostname().split(".")[0]
        conf = render(TEMPLATES / "slurm.conf.tmpl", {
            "STATE": str(self.state), "CTLD_HOST": host, "CTLD_PORT": str(self.port),
            "NODE_LIST": NODE_LIST, "NODE_PORTS": f"{self.port + 1}-{self.port + len(NODES)}",
            "NODE_CPUS": str(cpus), "NODE_MEM": str(memory), "MUNGE_SOCKET": str(self.munge_socket),
            "FIRST_JOB_ID": str(first_job_id(time.time(), self.slot))})
        hosts = render(TEMPLATES / "hosts.tmpl", {"CTLD_HOST": host, "NODE_NAMES": " ".join(NODES)})
        for path, text in ((self.conf, conf), (self.state / "etc" / "hosts", hosts)):
            path.write_text(text)
            path.chmod(0o644)

    def _start(self) -> None:
        self._check_state_dir()
        for port in range(self.port, self.port + len(NODES) + 1):
            if _port_in_use(port):
                raise ClusterError(f"port {port} on 127.0.0.1 is in use "
                                   "(another cluster? set SLURM_TITAN_CLUSTER_PORT)")
        self._fresh_state()
        self._write_configs()
        self._start_munged()
        self._start_slurmctld()
        for node in NODES:
            self._start_slurmd(node)
        end = time.monotonic() + self.timeout_s
        while not self.nodes_ok(idle=True):
            for daemon in self.daemons():
                if self.pid_of(daemon) is None:
                    self._fail_up(f"{daemon} exited during startup")
            if time.monotonic() >= end:
                self._fail_up(f"timed out after {self.timeout_s}s waiting for {len(NODES)} idle nodes")
            time.sleep(0.3)
        say(f"up: {len(NODES)} nodes idle; partitions low (default) and high; state {self.state}, logs {self.logs}")
        say('use it with: eval "$(tools/local-cluster env)"')

    def _fail_up(self, why: str) -> NoReturn:
        self._show_failure(15)
        say(f"stopping the half-started cluster (logs kept in {self.logs})")
        with contextlib.suppress(ClusterError):
            self._stop(lambda message: None)
        raise ClusterError(why)

    def _daemon(self, argv: list[str], log: str) -> subprocess.Popen:
        """Start a daemon in a session of its own, its output appended to STATE/log/`log`; it inherits no
        descriptor of ours (a caller reading our output until EOF would wait forever) and not our working
        directory (every job step's slurmstepd would say "Unable to get current working directory" once the
        folder the cluster was started from is gone)."""
        with open(self.logs / log, "ab") as out:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       env=self.daemon_env, start_new_session=True, cwd="/")
        self._started.append(process)
        return process

    def _start_munged(self) -> None:
        key, pid_file = self.state / "munge" / "munge.key", self.run_dir / "munged.pid"
        if subprocess.run(["mungekey", "--create", f"--keyfile={key}"], env=self.daemon_env,
                          stdout=subprocess.DEVNULL).returncode != 0:
            self._fail_up(f"mungekey could not create {key}")
        key.chmod(0o600)
        with open(self.logs / "munged.out", "ab") as out:  # munged forks itself into the background
            started = subprocess.run(["munged", f"--socket={self.munge_socket}", f"--key-file={key}",
                                      f"--pid-file={pid_file}", f"--log-file={self.logs / 'munged.log'}",
                                      f"--seed-file={self.state / 'munge' / 'munged.seed'}"],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=self.daemon_env)
        if started.returncode != 0:
            self._fail_up("munged failed to start")
        for _ in range(50):
            if pid_file.is_file() and self._munge_answers():
                shutil.copyfile(pid_file, self.run_dir / "pids" / "munged.pid")
                return
            time.sleep(0.1)
        self._fail_up(f"munged did not answer on {self.munge_socket}")

    def _munge_answers(self) -> bool:
        socket_arg = ["-S", str(self.munge_socket)]
        credential = subprocess.run(["munge", "-n", *socket_arg], env=self.daemon_env, capture_output=True)
        return credential.returncode == 0 and subprocess.run(
            ["unmunge", *socket_arg], input=credential.stdout, env=self.daemon_env, capture_output=True).returncode == 0

    def _start_slurmctld(self) -> None:
        process = self._daemon(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld.out")
        (self.run_dir / "pids" / "slurmctld.pid").write_text(f"{process.pid}\n")
        for _ in range(100):
            if self.pid_of("slurmctld") is None:
                time.sleep(0.1)
                if self.pid_of("slurmctld") is None:
                    self._fail_up("slurmctld exited")
            if "is UP" in self._slurm("scontrol", "ping", timeout=5).stdout:
                return
            time.sleep(0.2)
        self._fail_up("slurmctld did not answer scontrol ping")

    def _start_slurmd(self, node: str) -> None:
        etc_slurm = "/etc/slurm" if Path("/etc/slurm").is_dir() else ""
        process = self._daemon(["unshare", "--uts", "--mount", "sh", "-ec", NODE_SHELL, "sh", node, str(self.state),
                                str(SCRATCH_MNT), etc_slurm], f"slurmd-{node}.out")
        (self.run_dir / "pids" / f"slurmd-{node}.pid").write_text(f"{process.pid}\n")
        for _ in range(50):
            if procs.program(process.pid) == "slurmd" and (namespaces := procs.namespaces(process.pid)):
                (self.run_dir / "ns" / f"{node}.ns").write_text(f"{namespaces}\n")
                return
            if not procs.is_running(process.pid):
                self._fail_up(f"slurmd for {node} exited before starting")
            time.sleep(0.1)
        self._fail_up(f"slurmd for {node} did not start")

    # ---- down --------------------------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop everything the cluster started; its logs stay in STATE/log."""
        self.need_root()
        with self._locked():
            if not self.run_dir.is_dir():
                say(f"not up ({self.state})")
                return
            self._stop(say)
            say(f"down (logs kept in {self.logs})")

    def _stop(self, tell: Callable[[str], None]) -> None:
        """slurmd, slurmctld (and its slurmscriptd), anything still in a node namespace (slurmstepd, job
        tasks), then munged; checks that nothing of ours runs or stays mounted, then drops all but the logs."""
        slurmds = [pid for node in NODES if (pid := self.pid_of(f"slurmd-{node}"))]
        with procs.namespaces_held(slurmds) as held:  # held open first, then vouched for by running slurmds
            left = self._kill_all(held & self.node_namespaces(), tell)
        mounts = self._host_mounts()
        if mounts:
            tell("unmounting leaked host mounts: " + "\n".join(mounts))
            for target in sorted({line.split()[0] for line in mounts}, reverse=True):
                subprocess.run(["umount", "-l", target], env=self.daemon_env)
        if left:
            raise ClusterError(f"could not stop: {' '.join(left)}")
        # Keep the logs; drop everything else (a later `up` starts from scratch). The empty SCRATCH_MNT stays:
        # it may be a mountpoint inside another cluster's nodes.
        for part in ("etc", "run", "spool", "munge", "nodes"):
            shutil.rmtree(self.state / part, ignore_errors=True)

    def _kill_all(self, namespaces: set[str], tell: Callable[[str], None]) -> list[str]:
        """SIGTERM, then SIGKILL, the daemons and every process in the nodes' `namespaces` (held open by the
        caller: a process found in them is a node's own, never one of another cluster's node that the kernel
        gave a freed namespace's number to meanwhile); what is left running, as "daemon:pid" words."""
        pids = [pid for daemon in self.daemons() if daemon != "munged" and (pid := self.pid_of(daemon))]
        if controller := self.pid_of("slurmctld"):
            pids += procs.children(controller)
        procs.send(pids, signal.SIGTERM)
        stray = procs.in_namespaces(namespaces)
        procs.send(stray, signal.SIGTERM)
        if not procs.wait_gone(pids + stray, 10):
            tell("some processes ignored SIGTERM; sending SIGKILL")
            stray = procs.in_namespaces(namespaces)
            procs.send(pids + stray, signal.SIGKILL)
            procs.wait_gone(pids + stray, 5)
        if munged := self.pid_of("munged"):
            procs.send([munged], signal.SIGTERM)
            if not procs.wait_gone([munged], 5):
                procs.send([munged], signal.SIGKILL)
                procs.wait_gone([munged], 2)
        self._reap()
        left = [f"{daemon}:{pid}" for daemon in self.daemons() if (pid := self.pid_of(daemon))]
        if stray := procs.in_namespaces(namespaces):
            left.append("in-namespace:" + " ".join(map(str, stray)))
        return left

    def _host_mounts(self) -> list[str]:
        """Mounts of the host namespace under the state folder or the scratch mountpoint (none should be)."""
        table = subprocess.run(["findmnt", "-rn", "-o", "TARGET,SOURCE"], env=self.daemon_env, capture_output=True,
                               text=True).stdout
        return [line for line in table.splitlines() if str(self.state) in line or str(SCRATCH_MNT) in line]

    def _reap(self) -> None:
        """Collect the exit status of the daemons this object started and that are gone (no zombies left)."""
        self._started = [process for process in self._started if process.poll() is None]

    # ---- install -------------------------------------------------------------------------------------------------
    def install_deps(self) -> int:
        """apt-get the Slurm and munge packages unless every program is there; apt-get's exit code."""
        missing = missing_binary(self.path)
        if missing is None:
            say("dependencies already installed")
            return 0
        self.need_root()
        say(f"installing {' '.join(APT_PACKAGES)} (missing: {missing})")
        env = self.daemon_env | {"DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update"], APT_LINE.split()):
            code = subprocess.run(command, env=env).returncode
            if code != 0:
                return code
        return 0
