"""Helpers shared by the end-to-end tests: read training logs and steer a running job."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from pathlib import Path

from conftest import Cli, run, wait_for

STEP = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)*loss:\s*([0-9.]+)")


def step_losses(log: Path) -> list[tuple[int, str]]:
    """Every (step, loss) line of a rank log, in order, across attempts (loss kept as printed)."""
    return [(int(m.group(1)), m.group(2)) for m in STEP.finditer(log.read_text(errors="replace"))]


def job_dir(cli: Cli, job_id: str) -> Path:
    return Path(cli.status(job_id)["job_dir"])


def wait_for_log(path: Path, text: str, timeout: float = 300) -> None:
    wait_for(lambda: path.exists() and text in path.read_text(errors="replace"), timeout, f"{text!r} in {path}", 0.5)


def checkpoints(cli: Cli, location: str) -> list[dict]:
    return json.loads(cli("ckpt", "list", location, "--json").stdout)["checkpoints"]


def scontrol(cli: Cli, *args: str) -> str:
    return run(["scontrol", *args], env=cli.env).stdout


def job_field(cli: Cli, job_id: str, key: str) -> int:
    """A numeric field of `scontrol show job`: a count (Restarts=1) or a duration in seconds (RunTime=00:01:05)."""
    value = re.search(rf"\b{key}=(\S+)", scontrol(cli, "show", "job", job_id)).group(1)
    if ":" not in value:
        return int(value)
    days, _, clock = value.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def rank_processes(job_id: str) -> dict[int, dict[str, str]]:
    """The job's live training processes on this machine (every local node): pid -> their environment."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"slurm_titan.node.rank_entry" not in (entry / "cmdline").read_bytes():
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text(errors="replace").split("\0")
                       if "=" in item)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job_id:
            found[int(entry.name)] = env
    return found


class KillAtStep:
    """A real fault, injected from outside: SIGKILL every training process of `job_id` whose environment
    matches `match` (e.g. {"RANK": "1"} or {"SLURMD_NODENAME": "n2"}) once its own rank log shows step
    `step` after the process started; every attempt again, up to `times` kills. Use as a context manager."""

    def __init__(self, job_dir: Path, job_id: str, match: dict[str, str], step: int, times: int = 100) -> None:
        self.job_dir, self.job_id, self.match, self.step, self.left = job_dir, job_id, match, step, times
        self.killed: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "KillAtStep":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        offsets: dict[int, int] = {}  # pid -> its rank log's size when first seen
        pattern = re.compile(rf"step:\s*{self.step}\s")
        while not self._stop.wait(0.2) and self.left > 0:
            for pid, env in rank_processes(self.job_id).items():
                if any(env.get(key) != value for key, value in self.match.items()):
                    continue
                log = self.job_dir / "logs" / f"rank-{env['RANK']}.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                start = offsets.setdefault(pid, len(text))
                if pattern.search(text, start):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self.killed.append(env)
                        self.left -= 1
                    offsets[pid] = 1 << 62  # never again for this process


def kill_node(cluster_env: dict, name: str) -> int:
    """Kill node `name` of the bundled cluster whole: its slurmd and every process of its namespaces
    (slurmstepd, the supervisor, the ranks, their uploaders), found through the node's UTS namespace.
    Returns how many processes were killed; `tools/local-cluster up` brings the node back."""
    pid_file = Path(cluster_env["SLURM_TITAN_CLUSTER_DIR"]) / "run" / "pids" / f"slurmd-{name}.pid"
    namespace = os.readlink(f"/proc/{pid_file.read_text().strip()}/ns/uts")
    killed = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "uts") == namespace:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed += 1
    return killed
