"""The uploader process: a rank's CheckpointSync outside the training process (real child
processes, a plain directory and SeaweedFS as the remote)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from slurm_titan.ckpt.catalog import list_checkpoints
from slurm_titan.ckpt.storage import open_store
from slurm_titan.ckpt.upload import Uploader
from slurm_titan.ckpt.upload_process import UploaderProcess, UploadSettings
from slurm_titan.errors import StorageError
from tests.support.ckpt import write_fake_step
from tests.support.paths import repo_pythonpath
from tests.support.s3 import clean_env


def _uploaders(location: str, local, world_size: int, **kw) -> list[UploaderProcess]:
    """Started and ready (a rank does not wait: its first submit does)."""
    started = [UploaderProcess(UploadSettings(remote=location, local_folder=str(local), rank=r,
                                              world_size=world_size, attempt="a", **kw))
               for r in range(world_size)]
    for uploader in started:
        uploader.ready()
    return started


def test_ranks_upload_and_commit_through_their_processes(location, tmp_path):
    local = tmp_path / "local"
    ups = _uploaders(location, local, world_size=2)
    assert all(u.pid != os.getpid() for u in ups) and ups[0].pid != ups[1].pid
    assert all(isinstance(u, Uploader) for u in ups)
    for step in (4, 8):
        write_fake_step(local, step, world_size=2)
        for u in ups:
            u.submit(step)
    assert all(u.wait(timeout=60) for u in ups)
    assert [ups[0].status(s) for s in (4, 8)] == ["committed", "committed"] and ups[1].status(8) == "uploaded"
    assert ups[0].submitted(8) and not ups[0].submitted(12) and ups[0].in_flight() == set()
    assert all(u.close(timeout=60) for u in ups)
    assert [(i.step, i.complete) for i in list_checkpoints(open_store(location))] == [(4, True), (8, True)]
    assert all(u._proc.poll() is not None for u in ups)  # the children are gone


def test_an_unreachable_store_fails_when_awaited_in_one_line(monkeypatch, tmp_path):
    # the child starts without blocking its rank; the rank's first checkpoint awaits it (submit calls ready)
    clean_env(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s.getsockname()[1]}")
    uploader = UploaderProcess(UploadSettings(remote="s3://bucket/run", local_folder=str(tmp_path)))
    with pytest.raises(StorageError) as caught:
        uploader.submit(1)
    assert "cannot connect" in str(caught.value) and "\n" not in str(caught.value)
    assert "EXAMPLEKEY" not in str(caught.value)
    assert not uploader.submitted(1) and uploader._proc.poll() is not None  # nothing queued, the child gone


@pytest.mark.s3
def test_the_child_reaches_the_endpoint_its_settings_name(s3_env, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # checkpoint.endpoint_url only: none in the environment
    location = s3_env.fresh_url()
    up = _uploaders(location, tmp_path / "local", world_size=1, endpoint_url=s3_env.endpoint)[0]
    write_fake_step(tmp_path / "local", 1, world_size=1)
    up.submit(1)
    assert up.wait(1, timeout=60) and up.status(1) == "committed"
    assert up.close(timeout=60)
    assert [i.step for i in list_checkpoints(open_store(location, endpoint_url=s3_env.endpoint))] == [1]


def test_the_child_runs_below_training_on_its_own_cpus_and_ignores_stop_signals(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    up = _uploaders(str(tmp_path / "remote"), tmp_path / "local", world_size=1, nice=6, upload_cpus=frozenset({cpu}))[0]
    assert os.sched_getaffinity(up.pid) == {cpu}
    assert os.getpriority(os.PRIO_PROCESS, up.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 6)
    for signum in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        os.kill(up.pid, signum)  # Slurm signals every process of the step: the rank decides
    time.sleep(0.5)
    write_fake_step(tmp_path / "local", 2, world_size=1)
    up.submit(2)
    assert up.wait(2, timeout=60) and up.status(2) == "committed"
    assert up.close(timeout=60)


def test_a_dead_uploader_fails_the_waits_instead_of_hanging(tmp_path):
    up = _uploaders(str(tmp_path / "remote"), tmp_path / "local", world_size=2)[0]  # rank 1 never reports
    write_fake_step(tmp_path / "local", 3, world_size=2)
    up.submit(3)
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(up.wait(3)))
    waiter.start()
    os.kill(up.pid, signal.SIGKILL)
    waiter.join(30)
    assert waited == [False]
    assert up.status(3) == f"failed: the uploader process (pid {up.pid}) exited with code -9"
    assert up.close(timeout=5) is False


def test_the_child_dies_with_its_parent(tmp_path):
    script = ("from slurm_titan.ckpt.upload_process import UploaderProcess, UploadSettings\n"
              f"u = UploaderProcess(UploadSettings(remote={str(tmp_path / 'remote')!r},"
              f" local_folder={str(tmp_path)!r}))\n"
              "print(u.pid, flush=True)\n"
              "import os; os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], env=repo_pythonpath(), capture_output=True, text=True,
                         timeout=120)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.1)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive, not a zombie waiting for whoever adopted it to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
