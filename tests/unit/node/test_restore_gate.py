"""The ranks start while their node restores the checkpoint, and wait for it at a pipe."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_titan.envvars import RESTORE_FD
from slurm_titan.node.rendezvous import Rendezvous
from slurm_titan.node.supervisor import RankGroup
from slurm_titan.records import run_folder
from slurm_titan.records.restore_verdict import RestoreVerdict
from tests.support.paths import repo_pythonpath

RANK = ("import os; from slurm_titan.rank.restore_gate import wait_for_restore; "
        "print('waiting', flush=True); verdict = wait_for_restore(); "
        f"print('resharded', verdict and verdict.world_size_changed, {RESTORE_FD!r} in os.environ)")


def _group(tmp_path: Path, gated: bool = True) -> RankGroup:
    rdzv = Rendezvous("127.0.0.1", 29500, node_rank=1, num_nodes=2, procs_per_node=2, hosts=("a", "b"))
    return RankGroup([sys.executable, "-c", RANK], repo_pythonpath(), rdzv, tmp_path, gated=gated)


def _logs(tmp_path: Path) -> list[str]:
    return [run_folder.rank_log(tmp_path, r).read_text() for r in (2, 3)]


def test_ranks_wait_for_the_restore_and_take_its_verdict(tmp_path):
    ranks = _group(tmp_path)
    assert all(p.poll() is None for p in ranks.processes.values())  # held at the gate
    ranks.release(RestoreVerdict(world_size_changed=True))
    assert ranks.wait() == {2: 0, 3: 0}
    assert all(log.endswith("resharded True False\n") for log in _logs(tmp_path))


def test_a_failed_restore_stops_every_rank_with_an_error(tmp_path):
    ranks = _group(tmp_path)
    ranks.release(None)
    assert set(ranks.wait().values()) == {1}
    assert all("checkpoint restore failed" in log for log in _logs(tmp_path))


def test_ungated_ranks_do_not_wait(tmp_path):
    assert _group(tmp_path, gated=False).wait() == {2: 0, 3: 0}
    assert all(log.endswith("resharded None False\n") for log in _logs(tmp_path))


def test_kill_reaps_ranks_held_at_the_gate(tmp_path):
    ranks = _group(tmp_path)
    ranks.kill()
    assert {p.returncode for p in ranks.processes.values()} == {-9}
    ranks.release(None)  # after the kill: nothing to tell, nothing raised


def test_a_rank_that_fails_during_the_restore_ends_the_wait_for_it(tmp_path):
    rdzv = Rendezvous("127.0.0.1", 29500, node_rank=1, num_nodes=2, procs_per_node=2, hosts=("a", "b"))
    failing_rank = "import os, sys; os.environ['RANK'] == '3' and sys.exit(3); " + RANK
    ranks = RankGroup([sys.executable, "-c", failing_rank], dict(os.environ), rdzv, tmp_path, gated=True)
    restore_done = threading.Event()
    started = time.monotonic()
    ranks.release_after(lambda: restore_done.wait(60) and RestoreVerdict())  # a restore that would take a minute
    assert time.monotonic() - started < 30
    assert ranks.wait()[3] == 3
    assert "checkpoint restore failed" in run_folder.rank_log(tmp_path, 2).read_text()
    restore_done.set()


def test_a_restore_error_kills_the_ranks_and_is_raised(tmp_path):
    ranks = _group(tmp_path)

    def restore() -> RestoreVerdict:
        raise OSError("store unreachable")

    with pytest.raises(OSError, match="store unreachable"):
        ranks.release_after(restore)
    assert all(process.returncode is not None for process in ranks.processes.values())
