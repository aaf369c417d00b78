"""A store that throttles is waited out: SeaweedFS behind the throttling proxy (tests/support/throttle.py) answers a
share of the requests 503 SlowDown. Outcomes and counts are checked, never durations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.ckpt import CheckpointSync, list_checkpoints, open_store, read_manifest
from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM
from slurm_titan.ckpt.storage import Backoff, TransferConfig, s3_http
from slurm_titan.errors import StorageError
from slurm_titan.node.spec import CheckpointPlan
from slurm_titan.node.supervisor import restore as node_restore
from tests.support.ckpt import write_fake_step
from tests.support.cli import wait_for
from tests.support.throttle import ThrottledS3

pytestmark = pytest.mark.s3

MIB = 1 << 20


@pytest.fixture(params=["http", "fsspec"])
def data_path(request, monkeypatch):
    """Both ways files move: http.client (the default), and s3fs (SLURM_TITAN_CKPT_FAST_S3=0)."""
    monkeypatch.setenv(envvars.CKPT_FAST_S3, "1" if request.param == "http" else "0")
    monkeypatch.setenv(envvars.CKPT_PART_MB, "5")
    monkeypatch.setattr(s3_http, "_RANGED_MIN", MIB)  # files of a few MiB restored as parallel ranges
    return request.param


def _committed(proxy: ThrottledS3, local: Path, step: int, world_size: int, size: int) -> tuple[str, dict]:
    """A location holding committed step ``step`` (uploaded through the proxy while it throttles nothing)."""
    location = proxy.fresh_url("throttle")
    syncs = [CheckpointSync(location, str(local), rank=r, world_size=world_size, attempt="a", retry_initial=0.1,
                            poll_interval=0.1) for r in range(world_size)]
    files = write_fake_step(local, step, world_size, size=size)
    for s in syncs:
        s.submit(step)
    for s in syncs:
        assert s.close(timeout=120), s.status(step)
    return location, files


def _plan(location: str, endpoint: str) -> CheckpointPlan:
    return CheckpointPlan(local="", remote=location, endpoint_url=endpoint, config_digest="")


def test_a_restore_at_half_slow_down_completes_with_the_right_bytes(throttled_s3, data_path, tmp_path):
    location, files = _committed(throttled_s3, tmp_path / "saved", 30, world_size=3, size=12 * MIB)
    throttled_s3.configure(share=0.5, retry_after=None)
    throttled_s3.reset()
    said: list[str] = []
    node_restore.restore(_plan(location, throttled_s3.endpoint), str(tmp_path / "node"), "job", 3, said.append,
                         ranks=[0, 1, 2], node=0, nodes=1)
    restored = tmp_path / "node" / "step-30"
    assert {name: (restored / name).read_bytes() for name in files} == files
    assert throttled_s3.stats()["GET"]["throttled"] > 0
    if data_path == "http":  # s3fs retries a few refusals of its requests itself, unseen
        assert any(line.startswith("checkpoint restore: the store is throttling (SlowDown): waiting, ")
                   for line in said), said
    assert said[-1].startswith("resuming complete checkpoint step 30 from ")


def test_an_upload_at_half_slow_down_sends_each_part_once(throttled_s3, data_path, tmp_path):
    sizes = [11 * MIB, 12 * MIB + 5, 7 * MIB, 1000]
    items = []
    for i, n in enumerate(sizes):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(n))
        items.append((str(path), f"step-1/__{i}_0.distcp"))
    store = open_store(throttled_s3.fresh_url("upload"), transfer=TransferConfig(part_size=5 * MIB),
                       data_path=data_path)
    throttled_s3.configure(share=0.5, retry_after=None)
    throttled_s3.reset()
    entries = store.upload_many(items)
    put = throttled_s3.stats()["PUT"]
    throttled_s3.configure(share=0.0)
    assert put["throttled"] > 0
    assert put["bytes_in"] <= 1.1 * sum(sizes), put  # a refused part costs no body bytes, and only it is sent again
    assert [e.size for e in entries] == sizes
    got = store.checksum_many([(e.path, e.size) for e in entries], DEFAULT_ALGORITHM)
    assert got == [(e.size, e.checksum) for e in entries]


def test_a_store_that_refuses_beyond_the_total_ends_the_restore_naming_the_object(throttled_s3, tmp_path,
                                                                                   monkeypatch):
    location, _ = _committed(throttled_s3, tmp_path / "saved", 7, world_size=1, size=4096)
    throttled_s3.configure(share=1.0, paths=r"\.distcp", retry_after=1)
    monkeypatch.setenv(envvars.STORE_RETRY_S, "3")
    with pytest.raises(StorageError) as e:
        node_restore.restore(_plan(location, throttled_s3.endpoint), str(tmp_path / "node"), "job", 1, print,
                             ranks=[0], node=0, nodes=1)
    msg = str(e.value)
    assert "\n" not in msg and "step-7/attempt-a/__0_0.distcp" in msg and "SlowDown" in msg, msg
    assert "(still refused after " in msg and f"{envvars.STORE_RETRY_S}=3)" in msg
    assert not (tmp_path / "node" / "step-7").exists()
    throttled_s3.configure(share=0.0)
    assert [(i.step, i.complete) for i in list_checkpoints(open_store(location))] == [(7, True)]
    assert read_manifest(open_store(location), 7).world_size == 1


def test_a_refused_range_ends_the_restore_without_asking_for_the_ranges_after_it(throttled_s3, tmp_path,
                                                                                 monkeypatch):
    # A file of 8 ranges, 2 in flight at once, every try refused with a Retry-After beyond the budget: each range
    # gets two tries (the first, and one at its deadline); once one has failed, no range still waiting is asked
    # for (they were: the restore then took one budget for every 2 ranges, hours at 1800 s and a real node's
    # thousand ranges).
    location, _ = _committed(throttled_s3, tmp_path / "saved", 3, world_size=1, size=40 * MIB)
    monkeypatch.setattr(s3_http, "_RANGED_MIN", MIB)
    monkeypatch.setenv(envvars.CKPT_PART_MB, "5")
    monkeypatch.setenv(envvars.CKPT_CONCURRENCY, "2")
    monkeypatch.setenv(envvars.STORE_RETRY_S, "1")
    throttled_s3.configure(share=1.0, paths=r"\.distcp", methods=["GET"], retry_after=30)
    throttled_s3.reset()
    with pytest.raises(StorageError, match=r"step-3/attempt-a/__0_0\.distcp.*SlowDown"):
        node_restore.restore(_plan(location, throttled_s3.endpoint), str(tmp_path / "node"), "job", 1, print,
                             ranks=[0], node=0, nodes=1)
    assert throttled_s3.stats()["GET"]["throttled"] == 2 * 2  # 2 ranges, 2 tries each; not 8 ranges
    throttled_s3.configure(share=0.0)


def test_a_refused_piece_ends_the_fetch_of_a_nodes_share_without_asking_for_the_pieces_after_it(throttled_s3,
                                                                                                 tmp_path):
    # The same for the pieces of other ranks' files that a node's ranks read (download_pieces).
    store = open_store(throttled_s3.fresh_url("pieces"), transfer=TransferConfig(concurrency=2),
                       retry=Backoff(total=1.0))
    store.put_bytes("step-1/__0_0.distcp", bytes(8 * MIB))
    throttled_s3.configure(share=1.0, paths=r"\.distcp", methods=["GET"], retry_after=30)
    throttled_s3.reset()
    pieces = [(off, MIB, "0" * 64) for off in range(0, 8 * MIB, MIB)]
    with pytest.raises(StorageError, match=r"__0_0\.distcp.*SlowDown"):
        store.download_pieces([("step-1/__0_0.distcp", str(tmp_path / "f"), 8 * MIB, pieces)], DEFAULT_ALGORITHM)
    assert throttled_s3.stats()["GET"]["throttled"] == 2 * 2  # 2 pieces, 2 tries each; not 8 pieces
    throttled_s3.configure(share=0.0)


def test_a_small_operation_is_retried_by_the_store_alone(throttled_s3):
    # botocore and s3fs try a small operation once: every retry is the store's, after the store's Retry-After. A
    # read refused with Retry-After 2 under a 2 s deadline is asked for twice (first, then at the deadline); the
    # libraries' own retries made it 6 requests a try, none of them waiting what the store asked.
    store = open_store(throttled_s3.fresh_url("small"), retry=Backoff(total=2.0))
    store.put_bytes("step-1/commit.json", b"{}")
    throttled_s3.configure(share=1.0, methods=["GET"], retry_after=2)
    throttled_s3.reset()
    with pytest.raises(StorageError, match=r"step-1/commit\.json.*SlowDown.*still refused after 2 s and 2 tries"):
        store.cat("step-1/commit.json")
    assert throttled_s3.stats()["GET"]["throttled"] == 2
    throttled_s3.configure(share=0.0)


def test_a_held_write_lands_after_its_writer_is_gone(throttled_s3, tmp_path):
    # The proxy's hold (what the fenced-attempt e2e case uses): a PUT read whole and kept, its writer killed, the
    # write released later still reaches the store, as a partitioned node's write delayed in the network would.
    location = throttled_s3.fresh_url("held")
    throttled_s3.configure(hold=r"/late\.bin")
    writer = subprocess.Popen([sys.executable, "-c", "import sys; from slurm_titan.ckpt import open_store; "
                               "open_store(sys.argv[1]).put_bytes('late.bin', b'L' * 4096)", location])
    try:
        wait_for(lambda: throttled_s3.held()["waiting"], 60, "the write held at the proxy", 0.05)
    finally:
        writer.kill()
        writer.wait()
    store = open_store(location)
    assert not store.exists("late.bin")
    throttled_s3.configure(hold="")
    released = wait_for(lambda: throttled_s3.held()["released"], 60, "the held write released", 0.05)
    assert [status for _, status in released] == [200]
    assert store.cat("late.bin") == b"L" * 4096
