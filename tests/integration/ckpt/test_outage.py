"""The store goes away mid-run: uploads are retried, the commit completes later, nothing is
marked complete wrongly. Uses a SeaweedFS server of its own (it is stopped and restarted)."""

from __future__ import annotations

import time

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import list_checkpoints, read_manifest, verify
from slurm_titan.ckpt.storage import open_store
from slurm_titan.ckpt.upload import CheckpointSync
from tests.support.ckpt import write_fake_step
from tests.support.s3 import S3Server, weed_available

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(not weed_available(), reason="SeaweedFS 'weed' binary not available")]


def test_upload_survives_a_store_outage(tmp_path, monkeypatch):
    with S3Server() as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        location = srv.fresh_url("outage")
        local = tmp_path / "local"
        syncs = [CheckpointSync(location, str(local), rank=r, world_size=2, attempt="a", retry_initial=0.2,
                                retry_max=1.0, poll_interval=0.1) for r in range(2)]
        write_fake_step(local, 10, 2)
        for s in syncs:
            s.submit(10)
        assert all(s.wait(10, timeout=30) for s in syncs)

        srv.server.stop(timeout=0.5)  # the store dies (SIGKILL if it lingers): unreachable from here on
        write_fake_step(local, 20, 2, size=200_000)
        write_fake_step(local, 30, 2)
        for step in (20, 30):
            for s in syncs:
                s.submit(step)  # returns at once: training would go on
        time.sleep(1.0)
        assert not any(s.wait(20, timeout=0.1) for s in syncs)
        assert syncs[0].status(20) in ("uploading", "uploaded") and syncs[1].status(20) == "uploading"

        restarted = time.time()
        srv.start()
        assert all(s.wait(timeout=60) for s in syncs), [s.status(20) for s in syncs]
        assert [syncs[0].status(s) for s in (10, 20, 30)] == ["committed"] * 3
        for s in syncs:
            assert s.close(timeout=30)

        store = open_store(location)
        assert [(i.step, i.complete) for i in list_checkpoints(store)] == [(10, True), (20, True), (30, True)]
        m = read_manifest(store, 20)
        assert m.committed_at >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(restarted - 1))
        assert verify(store, 20).ok and verify(store, 30).ok
        assert store.exists(layout.receipt_path(20, 1, "a"))
