"""The ranks start (importing torch and torchtitan) before the node gives them the word, then while their node
restores the checkpoint, and wait for it at a pipe, answering the node's plan requests (what their load of a candidate
of another world size reads) on the way."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_titan.envvars import RESTORE_FD, START_FD
from slurm_titan.node.budgets import Budgets, WatchdogSpec
from slurm_titan.node.supervisor.rendezvous import Rendezvous
from slurm_titan.node.supervisor.supervisor import RankGroup
from slurm_titan.node.supervisor.watchdog import Watchdog
from slurm_titan.records import run_folder
from slurm_titan.records.restore_verdict import RestoreVerdict
from tests.support.paths import repo_pythonpath

RANK = ("import os; from slurm_titan.rank.restore_gate import wait_for_restore; "
        "print('waiting', flush=True); verdict = wait_for_restore(); "
        f"print('resharded', verdict and verdict.world_size_changed, {RESTORE_FD!r} in os.environ)")


# each rank's "load" reads one byte of a file named after the planning folder, at its rank
PLANNING = ("import os; from slurm_titan.rank.restore_gate import wait_for_restore; "
            "verdict = wait_for_restore(lambda folder: [(os.path.basename(folder), int(os.environ['RANK']), 1)]); "
            "print('resharded', verdict.world_size_changed)")


def _group(tmp_path: Path, gated: bool = True, rank: str = RANK, watchdog: Watchdog | None = None) -> RankGroup:
    rdzv = Rendezvous("127.0.0.1", 29500, node_rank=1, num_nodes=2, procs_per_node=2, hosts=("a", "b"))
    return RankGroup([sys.executable, "-c", rank], repo_pythonpath(), rdzv, tmp_path, gated=gated, watchdog=watchdog)


def _folder(tmp_path: Path, name: str) -> str:
    """A planning folder, as the node's restore makes one (the candidate's .metadata in it)."""
    (tmp_path / name).mkdir()
    (tmp_path / name / ".metadata").write_bytes(b"metadata")
    return str(tmp_path / name)


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


def test_ranks_answer_every_plan_request_then_take_the_verdict(tmp_path):
    ranks = _group(tmp_path, rank=PLANNING)
    for name in ("plan-12", "plan-10"):  # a fallback to an older candidate plans again, against its metadata
        folder = _folder(tmp_path, name)
        assert ranks.plan(folder) == {2: [(name, 2, 1)], 3: [(name, 3, 1)]}
        assert sorted(os.listdir(folder)) == [".metadata", "reads-2.json", "reads-3.json"]  # written whole: no .tmp
    assert all(p.poll() is None for p in ranks.processes.values())  # still at the gate
    ranks.release(RestoreVerdict(world_size_changed=True))
    assert ranks.wait() == {2: 0, 3: 0}
    assert all(log.endswith("resharded True\n") for log in _logs(tmp_path))


@pytest.mark.parametrize(("rank", "why"), [
    (RANK, "RuntimeError: this rank has no load planner"),
    (PLANNING.replace("lambda folder: [", "lambda folder: 1 / 0 or ["), "ZeroDivisionError"),
])
def test_a_rank_that_cannot_plan_makes_the_node_fetch_all_and_still_takes_the_verdict(tmp_path, capsys, rank, why):
    ranks = _group(tmp_path, rank=rank)
    assert ranks.plan(_folder(tmp_path, "plan")) is None
    said = capsys.readouterr().out
    assert "cannot tell what its checkpoint load reads" in said and why in said and "fetching all of it" in said
    ranks.release(RestoreVerdict(world_size_changed=True))
    assert ranks.wait() == {2: 0, 3: 0}
    assert all("resharded True" in log for log in _logs(tmp_path))


def test_a_rank_that_dies_before_answering_ends_the_plan_and_the_restore(tmp_path, capsys):
    ranks = _group(tmp_path, rank="import os, sys; os.environ['RANK'] == '3' and sys.exit(3); " + PLANNING)
    restore_done = threading.Event()
    planned: dict[str, object] = {}

    def restore() -> RestoreVerdict:
        planned["reads"] = ranks.plan(_folder(tmp_path, "plan"))
        restore_done.wait(60)  # the fetch that would follow
        return RestoreVerdict(world_size_changed=True)

    started = time.monotonic()
    ranks.release_after(restore)  # abandoned once rank 3 is seen dead
    assert time.monotonic() - started < 30
    assert ranks.wait()[3] == 3
    deadline = time.monotonic() + 10
    while "reads" not in planned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert planned == {"reads": None}
    assert "rank 3 exited" in capsys.readouterr().out
    restore_done.set()


def test_a_rank_that_never_reaches_its_gate_ends_the_plan_after_the_startup_budget(tmp_path, capsys):
    limits = Budgets(watchdog=WatchdogSpec(startup_s=2, restore_s=5, first_step_s=5, step_floor_s=1, step_factor=3,
                                           save_s=5, upload_s=5, stopped_s=15), step_cap_s=100)
    dog = Watchdog(limits, [2, 3], tmp_path, 0, learns=False, say=lambda _: None)
    hung = "import os, time; os.environ['RANK'] == '3' and time.sleep(120); " + PLANNING
    ranks = _group(tmp_path, rank=hung, watchdog=dog)
    try:
        started = time.monotonic()
        assert ranks.plan(_folder(tmp_path, "plan")) is None
        assert 2 <= time.monotonic() - started < 30
        assert "ranks [3] did not answer within the start-up budget" in capsys.readouterr().out
    finally:
        ranks.kill()
        dog.close()


STARTING = ("import os; from slurm_titan.rank.start_gate import wait_for_start; print('imported', flush=True); "
            f"wait_for_start(); print('started', os.environ.get('EXTRA'), {START_FD!r} in os.environ)")


def _imported(tmp_path: Path) -> bool:
    return all(log.startswith("imported") for log in _logs(tmp_path))


def test_ranks_import_then_wait_for_the_word_and_take_its_environment(tmp_path: Path) -> None:
    ranks = _group(tmp_path, gated=False, rank=STARTING)
    deadline = time.monotonic() + 30
    while not _imported(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert all(p.poll() is None for p in ranks.processes.values()) and _imported(tmp_path)  # held at the start
    assert not any("started" in log for log in _logs(tmp_path))
    ranks.start({"EXTRA": "ram"})
    assert ranks.wait() == {2: 0, 3: 0}
    assert all(log.endswith("started ram False\n") for log in _logs(tmp_path))


def test_ranks_whose_start_pipe_closes_without_a_word_end_without_training(tmp_path: Path) -> None:
    ranks = _group(tmp_path, gated=False, rank=STARTING)
    for fd in ranks.starts.values():  # the supervisor went away before the word
        os.close(fd)
    ranks.starts.clear()
    assert ranks.wait() == {2: 0, 3: 0}
    assert not any("started" in log for log in _logs(tmp_path))
