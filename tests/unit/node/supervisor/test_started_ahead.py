"""A node supervisor of a step started ahead (node.batch.ahead): its ranks import while it waits for the supervisor of
the attempt it follows on its node to end, then for the batch shell's word; it goes on as the attempt on "go", and
ends without a report, its ranks killed, on "end" or a stop signal."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from slurm_titan.node.supervisor.presence import Presence
from slurm_titan.node.supervisor.rendezvous import Rendezvous
from slurm_titan.node.supervisor.supervisor import NodeSupervisor, RankGroup
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from tests.support.paths import repo_pythonpath

WAITING = "from slurm_titan.rank.start_gate import wait_for_start; wait_for_start(); print('trained')"


RDZV = Rendezvous("127.0.0.1", 29500, node_rank=0, num_nodes=1, procs_per_node=2, hosts=("a",))


def _supervisor(tmp_path: Path) -> tuple[NodeSupervisor, HeldFolder]:
    supervisor = NodeSupervisor(spec=None)  # type: ignore[arg-type]  # the wait reads nothing of the spec
    supervisor.ranks = RankGroup([sys.executable, "-c", WAITING], repo_pythonpath(), RDZV, tmp_path)
    supervisor.stop_file = run_folder.stop_file(tmp_path, 1, 0)
    return supervisor, HeldFolder(run_folder.attempt_folder(tmp_path, 1))


def _later(action: Any, *args: Any) -> None:
    threading.Timer(0.3, action, args).start()


def test_the_word_to_go_lets_the_node_go_on_with_its_ranks_waiting_to_start(tmp_path: Path) -> None:
    supervisor, attempt_dir = _supervisor(tmp_path)
    _later(attempt_dir.replace_text, run_folder.AHEAD_WORD, json.dumps({"go": True}))
    supervisor._wait_for_word(attempt_dir, RDZV, tmp_path, 0)
    assert supervisor.ranks is not None and all(p.poll() is None for p in supervisor.ranks.processes.values())
    supervisor.ranks.start({})
    assert supervisor.ranks.wait() == {0: 0, 1: 0}


@pytest.mark.parametrize("ended_by", ["word", "signal"])
def test_a_step_not_needed_ends_quietly_its_ranks_killed(tmp_path: Path, ended_by: str) -> None:
    supervisor, attempt_dir = _supervisor(tmp_path)
    if ended_by == "word":
        _later(attempt_dir.replace_text, run_folder.AHEAD_WORD, json.dumps({"go": False}))
    else:  # the job is cancelled or preempted meanwhile: nothing of this step to save
        _later(supervisor._on_signal, signal.SIGTERM, None)
    with pytest.raises(SystemExit) as ended:
        supervisor._wait_for_word(attempt_dir, RDZV, tmp_path, 0)
    assert ended.value.code == 0
    assert supervisor.ranks is not None and {p.returncode for p in supervisor.ranks.processes.values()} == {-9}
    assert not run_folder.node_report(tmp_path, 1, 0).exists() and not supervisor.stop_file.exists()
    assert not supervisor.terminated


@pytest.mark.parametrize("stopped", [False, True])
def test_a_standby_looks_for_the_word_only_once_the_attempt_it_follows_ended_on_its_node(tmp_path: Path,
                                                                                          stopped: bool) -> None:
    """The word is there early (as if for another node); this node's supervisor of attempt 0 still runs, so the
    standby waits for it (a connection to its abstract socket, no lookup of the folder), then goes on at once.
    A stop signal meanwhile ends the wait."""
    supervisor, attempt_dir = _supervisor(tmp_path)
    attempt_dir.replace_text(run_folder.AHEAD_WORD, json.dumps({"go": True}))
    running = Presence(tmp_path, 0, 0)
    if stopped:
        _later(supervisor._on_signal, signal.SIGUSR2, None)
        with pytest.raises(SystemExit):
            supervisor._wait_for_word(attempt_dir, RDZV, tmp_path, 0)
        running.close()
        return
    _later(running.close)
    supervisor._wait_for_word(attempt_dir, RDZV, tmp_path, 0)
    assert running.sock is None  # it went on only after the supervisor it follows was gone
    assert supervisor.ranks is not None
    supervisor.ranks.kill()


def test_a_standby_whose_rank_ended_before_any_word_ends_quietly(tmp_path: Path) -> None:
    """A rank of the step gone while it waits (out of memory, say): the step is not fit to be taken; it ends without a
    report, and `finish`, seeing its srun's exit code, starts a step of its own."""
    supervisor, attempt_dir = _supervisor(tmp_path)
    assert supervisor.ranks is not None
    supervisor.ranks.processes[1].kill()
    with pytest.raises(SystemExit) as ended:
        supervisor._wait_for_word(attempt_dir, RDZV, tmp_path, 0)
    assert ended.value.code == 0 and not run_folder.node_report(tmp_path, 1, 0).exists()
    assert all(p.poll() is not None for p in supervisor.ranks.processes.values())
