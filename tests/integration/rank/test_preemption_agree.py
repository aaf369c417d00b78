"""Every rank agrees to stop when any one got Slurm's signal (real gloo collective, 2 processes)."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

WORKER = textwrap.dedent("""
    import os, signal, sys
    from slurm_titan.rank import preemption
    preemption.install_handlers()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first = preemption.agreed_stop()          # nobody signalled yet
    if rank == int(os.environ["SIGNALLED_RANK"]):
        os.kill(os.getpid(), signal.SIGUSR2)  # a real signal, handled by the rank's handler
    second = preemption.agreed_stop()
    print(f"rank {rank}: {first} {second}", flush=True)
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(signalled: int, extra_env: dict | None = None) -> list[str]:
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": port, "SIGNALLED_RANK": str(signalled)}
                              | (extra_env or {}))
             for r in range(2)]
    return sorted(p.communicate(timeout=120)[0].strip() for p in procs)


def test_one_signalled_rank_stops_every_rank() -> None:
    assert run_ranks(signalled=1) == ["rank 0: False True", "rank 1: False True"]


def test_no_signal_no_stop() -> None:
    assert run_ranks(signalled=-1) == ["rank 0: False False", "rank 1: False False"]


def test_stop_file_left_by_the_supervisor_counts(tmp_path: Path) -> None:
    stop_file = tmp_path / "stop-node-0"
    stop_file.write_text(signal.Signals.SIGUSR2.name)
    assert run_ranks(-1, {"SLURM_TITAN_STOP_FILE": str(stop_file)}) == [
        "rank 0: True True", "rank 1: True True"]
