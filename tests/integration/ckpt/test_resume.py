"""prepare_resume: the newest complete checkpoint on local disk, newer uncommitted local steps hidden."""

from __future__ import annotations

import os

from slurm_titan.ckpt import restore as restore_module
from slurm_titan.ckpt.restore import hide_uncommitted, prepare_resume
from slurm_titan.ckpt.upload import CheckpointSync
from tests.support.ckpt import write_fake_step


def test_prepare_resume_restores_and_hides_uncommitted(location, tmp_path):
    saver = tmp_path / "saver"
    s = CheckpointSync(location, str(saver), attempt="a", poll_interval=0.05)
    files = write_fake_step(saver, 10, 1)
    s.submit(10)
    assert s.wait(timeout=30) and s.close(timeout=30)

    node = tmp_path / "node"
    write_fake_step(node, 20, 1)  # saved by the previous attempt, never committed
    write_fake_step(node, 5, 1)  # older: left alone (torchtitan resumes from the newest)
    (node / ".restoring-10-999999").mkdir()  # a restore killed earlier
    first = prepare_resume(location, str(node))
    assert (first.step, first.world_size, first.reused) == (10, 1, False)
    names = sorted(os.listdir(node))
    assert "step-10" in names and "step-5" in names and "step-20" not in names
    assert any(n.startswith(".uncommitted-20-") for n in names)
    assert not any(n.startswith(".restoring-") for n in names)
    assert all("step-" not in n for n in names if n.startswith("."))  # torchtitan matches "step-N" anywhere
    for name, data in files.items():
        assert (node / "step-10" / name).read_bytes() == data
    # a second call finds the intact copy and downloads nothing
    again = prepare_resume(location, str(node))
    assert (again.step, again.world_size, again.reused) == (10, 1, True)


def test_prepare_resume_lists_the_location_once(tmp_path, monkeypatch):
    saver = tmp_path / "saver"
    s = CheckpointSync(str(tmp_path / "remote"), str(saver), attempt="a", poll_interval=0.05)
    write_fake_step(saver, 10, 1)
    s.submit(10)
    assert s.wait(timeout=30) and s.close(timeout=30)
    listings = []
    real = restore_module.list_checkpoints
    monkeypatch.setattr(restore_module, "list_checkpoints",
                        lambda store: listings.append(store.location) or real(store))
    assert prepare_resume(str(tmp_path / "remote"), str(tmp_path / "node")).step == 10
    assert len(listings) == 1


def test_fresh_start_hides_every_uncommitted_step(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    node = tmp_path / "node"
    write_fake_step(node, 3, 1)
    assert prepare_resume(str(remote), str(node)) is None
    assert [n for n in os.listdir(node) if n.startswith("step-")] == []
    assert hide_uncommitted(str(tmp_path / "missing"), None) == []
