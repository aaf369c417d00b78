"""The node supervisor: the one Slurm task per node, started by submitit on every node of a job.

It derives the rendezvous from Slurm's variables, starts one training process per device with
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, streams each rank's output to
`<job>/logs/rank-R.log`, stops the node's other ranks when one fails, and exits with the first
failure's exit code so that Slurm marks the job FAILED.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from slurm_titan import history, rendezvous
from slurm_titan.plan import NodeSpec

STOP_GRACE_S = 15.0
POLL_S = 0.5


def _say(message: str) -> None:
    print(f"[slurm-titan {socket.gethostname()}] {message}", flush=True)


class RankGroup:
    """The training processes of this node."""

    def __init__(self, argv: list[str], rdzv: rendezvous.Rendezvous, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        for local_rank in range(rdzv.procs_per_node):
            env = os.environ | rdzv.process_env(local_rank)
            rank = int(env["RANK"])
            with (log_dir / f"rank-{rank}.log").open("ab") as log:
                self.processes[rank] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def signal_all(self, signum: int) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signum)

    def stop(self) -> None:
        """SIGTERM the ranks still running, SIGKILL what is left after a grace period."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes.values()):
            time.sleep(POLL_S)
        self.signal_all(signal.SIGKILL)

    def wait(self) -> int:
        """Wait for every rank; on the first failure stop the others. Returns the exit code for the node."""
        while True:
            codes = {rank: process.poll() for rank, process in self.processes.items()}
            failed = {rank: code for rank, code in codes.items() if code not in (None, 0)}
            if failed:
                rank, code = min(failed.items())
                _say(f"rank {rank} exited with code {code}; stopping the node's other ranks")
                self.stop()
                return code if code > 0 else 128 - code
            if all(code == 0 for code in codes.values()):
                return 0
            time.sleep(POLL_S)


class NodeSupervisor:
    """Picklable callable that submitit runs once on every node."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec

    def __call__(self) -> None:
        spec, env = self.spec, os.environ
        rdzv = rendezvous.from_slurm_env(env, spec.procs_per_node, spec.port_window, rendezvous.read_ephemeral_range())
        job_id = env["SLURM_JOB_ID"]
        attempt = int(env.get("SLURM_RESTART_COUNT", "0"))
        job_dir, argv = spec.resolve(job_id)
        first = rdzv.node_rank * rdzv.procs_per_node
        _say(f"node {rdzv.node_rank}/{rdzv.num_nodes} of job {job_id} attempt {attempt}: master "
             f"{rdzv.master_addr}:{rdzv.master_port}, world size {rdzv.world_size}, "
             f"ranks {first}..{first + rdzv.procs_per_node - 1}, device {spec.device}")
        if rdzv.node_rank == 0:
            history.append_event(job_dir, "start", attempt, hosts=list(rdzv.hosts))
        ranks = RankGroup(argv, rdzv, job_dir / "logs")
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(signum, self._forward(ranks))
        code = ranks.wait()
        if rdzv.node_rank == 0:
            history.append_event(job_dir, "end", attempt, exit_code=code, reason="finished" if code == 0 else "failed")
        _say(f"node {rdzv.node_rank} done: exit code {code}")
        if code:
            sys.exit(code)

    @staticmethod
    def _forward(ranks: RankGroup):  # noqa: ANN205
        def handler(signum: int, frame: FrameType | None) -> None:
            _say(f"got signal {signal.Signals(signum).name}; passing it to the ranks")
            ranks.signal_all(signum)

        return handler
