"""A surviving supervisor requeues the job when the batch shell is gone (slurm_titan.node.supervisor.batch_host)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from slurm_titan.node.batch import step_watch
from slurm_titan.node.supervisor import batch_host


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Slurm's answers as recorded from `scontrol show job -o` on the bundled cluster, and what was asked."""
    asked: dict = {"probed": [], "requeued": 0, "answers": True}
    monkeypatch.setattr(batch_host, "_job_fields", lambda job_id: {"BatchHost": "n1", "JobState": "RUNNING",
                                                                   "NodeList": "n[1-2]"})
    monkeypatch.setattr(batch_host, "probe_failures",
                        lambda hosts: asked["probed"].extend(hosts) or (set() if asked["answers"] else set(hosts)))
    monkeypatch.setattr(batch_host, "_requeue", lambda job_id: asked.__setitem__("requeued", asked["requeued"] + 1)
                        or True)
    monkeypatch.setattr(batch_host, "POLL_S", 0.01)
    return asked


def test_a_beat_after_the_failure_leaves_the_decision_to_the_batch_shell(tmp_path: Path, cluster: dict) -> None:
    failed_at = time.time()
    beating = threading.Timer(0.1, step_watch.beat, (tmp_path, 0))
    beating.start()
    assert batch_host.requeue_if_batch_shell_gone(tmp_path, 0, "7", failed_at, "n2", stale_s=5) is None
    beating.join()
    assert cluster["probed"] == [] and cluster["requeued"] == 0


def test_no_beat_and_no_answer_requeues_the_job(tmp_path: Path, cluster: dict) -> None:
    step_watch.beat(tmp_path, 0)  # a beat from before the failure does not count
    cluster["answers"] = False
    assert batch_host.requeue_if_batch_shell_gone(tmp_path, 0, "7", time.time() + 0.01, "n2", stale_s=0.2) == "n1"
    assert cluster["probed"] == ["n1"] and cluster["requeued"] == 1


def test_no_beat_but_the_host_answers_requeues_nothing(tmp_path: Path, cluster: dict) -> None:
    assert batch_host.requeue_if_batch_shell_gone(tmp_path, 0, "7", time.time(), "n2", stale_s=0.1) is None
    assert cluster["probed"] == ["n1"] and cluster["requeued"] == 0


def test_the_batch_host_itself_never_waits(tmp_path: Path, cluster: dict) -> None:
    assert batch_host.requeue_if_batch_shell_gone(tmp_path, 0, "7", time.time(), "n1", stale_s=5) is None
    assert cluster["probed"] == []
