"""A surviving supervisor requeues the job when the batch shell is gone (slurm_titan.node.supervisor.batch_host)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_titan.errors import ClusterError
from slurm_titan.node.supervisor import batch_host
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Slurm's answers as recorded from `scontrol show job -o` on the bundled cluster, and what was asked."""
    asked: dict = {"queried": 0, "probed": [], "requeued": 0, "answers": True}

    def job_fields(job_id: str) -> dict[str, str]:
        asked["queried"] += 1
        return {"BatchHost": "n1", "JobState": "RUNNING", "NodeList": "n[1-2]"}

    monkeypatch.setattr(batch_host, "_job_fields", job_fields)
    monkeypatch.setattr(batch_host, "probe_failures",
                        lambda hosts: asked["probed"].extend(hosts) or (set() if asked["answers"] else set(hosts)))
    monkeypatch.setattr(batch_host, "_requeue", lambda job_id: asked.__setitem__("requeued", asked["requeued"] + 1)
                        or True)
    monkeypatch.setattr(batch_host, "POLL_S", 0.01)
    return asked

Attempts = Callable[[int], HeldFolder]


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[Attempts]:
    """The attempts' folders of a job folder in tmp_path, held open as the supervisors hold them."""
    held = {attempt: HeldFolder(run_folder.attempt_folder(tmp_path, attempt)) for attempt in (0, 1)}
    yield held.__getitem__
    for folder in held.values():
        folder.close()


def _beat(attempt_dir: HeldFolder) -> None:
    attempt_dir.touch(run_folder.BATCH_SHELL_BEAT)


def _claim(attempt_dir: HeldFolder, claim: int = 0) -> Path:
    return attempt_dir.path / run_folder.batch_host_probe_name(claim)


def test_a_beat_after_the_failure_leaves_the_decision_to_the_batch_shell(attempts: Attempts, cluster: dict) -> None:
    failed = batch_host.mark_beat(attempts(0))
    beating = threading.Timer(0.1, _beat, (attempts(0),))
    beating.start()
    assert batch_host.requeue_if_batch_shell_gone(attempts(0), "7", failed, "n2", 2, stale_s=5) is None
    beating.join()
    assert cluster["queried"] == 0  # the heartbeat first: a node loss costs slurmctld nothing while the shell beats
    assert cluster["probed"] == [] and cluster["requeued"] == 0


def _check_now(attempt_dir: HeldFolder, host: str, stale_s: float) -> str | None:
    """The check of `host`'s supervisor, whose ranks failed just now (job 7)."""
    return batch_host.requeue_if_batch_shell_gone(attempt_dir, "7", batch_host.mark_beat(attempt_dir), host, 3,
                                                  stale_s=stale_s)


def _beat_stamped(attempt_dir: HeldFolder, skew_s: float) -> None:
    """A beat stamped by a clock `skew_s` off this one (the batch host's, or the file server's)."""
    _beat(attempt_dir)
    stamp = time.time() + skew_s
    os.utime(run_folder.BATCH_SHELL_BEAT, (stamp, stamp), dir_fd=attempt_dir.fd)


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0])
def test_the_heartbeats_times_are_compared_with_each_other_not_with_this_nodes_clock(
        attempts: Attempts, cluster: dict, skew_s: float) -> None:
    """A heartbeat stamped an hour behind or ahead of this node's clock: a beat after the failure still says the
    batch shell lives, and a last beat from before the failure still says it is gone."""
    _beat_stamped(attempts(0), skew_s)
    failed = batch_host.mark_beat(attempts(0))
    beating = threading.Timer(0.1, _beat_stamped, (attempts(0), skew_s))
    beating.start()
    assert batch_host.requeue_if_batch_shell_gone(attempts(0), "7", failed, "n2", 2, stale_s=5) is None
    beating.join()
    assert cluster["probed"] == []
    cluster["answers"] = False
    assert _check_now(attempts(0), "n2", 0.2) == "n1"


def test_no_beat_and_no_answer_requeues_the_job(attempts: Attempts, cluster: dict) -> None:
    _beat(attempts(0))  # a beat from before the failure does not count
    cluster["answers"] = False
    assert _check_now(attempts(0), "n2", 0.2) == "n1"
    assert cluster["probed"] == ["n1"] and cluster["requeued"] == 1


def test_no_beat_but_the_host_answers_requeues_nothing(attempts: Attempts, cluster: dict) -> None:
    assert _check_now(attempts(0), "n2", 0.1) is None
    assert cluster["probed"] == ["n1"] and cluster["requeued"] == 0


def test_the_batch_host_itself_never_probes_itself(attempts: Attempts, cluster: dict) -> None:
    assert _check_now(attempts(0), "n1", 0.1) is None
    assert cluster["probed"] == []


def test_one_supervisor_checks_a_silent_batch_host_the_others_wait_for_its_outcome(attempts: Attempts,
                                                                                   cluster: dict) -> None:
    cluster["answers"] = False
    hosts = [f"n{node}" for node in range(2, 10)]
    with ThreadPoolExecutor(len(hosts)) as pool:
        found = list(pool.map(lambda host: _check_now(attempts(0), host, 0.1), hosts))
    assert [host for host in found if host] == ["n1"] and found.count(None) == 7  # one requeued the job for n1
    assert (cluster["queried"], cluster["probed"], cluster["requeued"]) == (1, ["n1"], 1)
    assert "n1" in _claim(attempts(0)).read_text()  # the claimant's outcome


def test_a_claim_without_an_outcome_is_waited_for_then_taken_over(attempts: Attempts, cluster: dict,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    claim = _claim(attempts(0))
    claim.touch()  # another supervisor checks the batch host
    threading.Timer(0.2, claim.write_text, ("batch host n1 answers",)).start()
    assert _check_now(attempts(0), "n2", 0) is None
    assert cluster["queried"] == 0 and cluster["probed"] == []  # its outcome stands for this node too
    monkeypatch.setattr(batch_host, "CLAIM_STALE_S", 0.2)
    claim = _claim(attempts(1))
    claim.touch()  # a claimant that died before its outcome
    assert _check_now(attempts(1), "n2", 0) is None
    assert cluster["probed"] == ["n1"] and "answers" in _claim(attempts(1), 1).read_text()


def test_a_slurm_query_without_an_answer_is_said_and_asked_again(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    answers = iter([ClusterError("scontrol show job -o 7 did not answer within 30 s: is slurmctld up?")])

    def run(argv: list[str], check: bool = True) -> object:
        if error := next(answers, None):
            raise error
        return type("Done", (), {"stdout": "JobId=7 JobState=RUNNING NodeList=n2 BatchHost=n1"})()

    monkeypatch.setattr(batch_host.slurm, "run", run)
    assert batch_host.lost_batch_host("7") == "n1"
    assert "did not answer within 30 s" in capsys.readouterr().out  # a line of the node log
