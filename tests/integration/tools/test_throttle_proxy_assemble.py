"""The throttling proxy keeping multipart parts under S3's 5 MiB (tools/local_s3/throttle_proxy.py, ``assemble``), in
front of SeaweedFS (which refuses such parts at completion): the project's own S3 upload through it, in 1 KiB parts;
with ``discard``, files of zeros kept as their size, the store holding none of their bytes. Outcomes and counts
only."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_titan.ckpt import open_store
from slurm_titan.ckpt.storage import Store, TransferConfig
from slurm_titan.errors import StorageError
from tests.support.s3 import S3Server
from tools.local_s3.throttle_proxy import BadConfig, Config, Server, Throttle, Zeros

pytestmark = pytest.mark.s3

PART = 1 << 10


def _proxy(s3_env: S3Server, discard: Zeros | None) -> Iterator[Server]:
    """A proxy in front of the shared server that assembles parts; its first assembly fails (the store times out)."""
    host, port = s3_env.endpoint.removeprefix("http://").split(":")
    failures = [OSError("timed out")]

    def assemble(path: str, body: bytes) -> tuple[int, bytes]:
        if failures:
            raise failures.pop()
        return s3_env.server.request("PUT", path, body=body, timeout=30)

    server = Server(0, (host, int(port)), Throttle(Config()), keep_requests=True, assemble=assemble, discard=discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(s3_env: S3Server) -> Iterator[Server]:
    yield from _proxy(s3_env, discard=None)


@pytest.fixture
def discarding(s3_env: S3Server) -> Iterator[Server]:
    yield from _proxy(s3_env, discard=Zeros())


def _store(s3_env: S3Server, endpoint: str | None = None) -> Store:
    """A fresh location uploading in 1 KiB parts, through `endpoint` (None: the server itself)."""
    small = dataclasses.replace(TransferConfig(), part_size=PART, min_part_size=PART, block_size=4 << 10)
    return open_store(s3_env.fresh_url("assemble"), endpoint_url=endpoint, transfer=small)


def test_parts_under_5_mib_are_kept_and_the_file_is_written_whole(s3_env: S3Server, proxy: Server,
                                                                    tmp_path: Path) -> None:
    data = os.urandom(3 * PART + 100)
    (tmp_path / "f").write_bytes(data)
    store = _store(s3_env, proxy.endpoint)
    [entry] = store.upload_many([(str(tmp_path / "f"), "step-1/f")])
    assert entry.size == len(data) and store.cat("step-1/f") == data  # completed once the failed assembly was retried
    parts = [r for r in proxy.counters.requests if r.method == "PUT" and "partNumber=" in r.path]
    assert len(parts) == 4 and all(r.status == 200 for r in parts)
    assert [r.status for r in proxy.counters.requests if r.method == "POST" and "uploadId=" in r.path] == [500, 200]
    assert proxy.parts == {}  # nothing kept once written


def test_without_the_proxy_seaweedfs_refuses_such_parts(s3_env: S3Server, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(3 * PART))
    store = _store(s3_env)
    with pytest.raises(StorageError, match="EntityTooSmall"):
        store.upload_many([(str(tmp_path / "f"), "step-1/f")])


def test_with_discard_a_file_of_zeros_is_stored_empty_and_read_back_whole(s3_env: S3Server, discarding: Server,
                                                                          tmp_path: Path) -> None:
    size = 3 * PART + 100
    with open(tmp_path / "zeros", "wb") as f:
        f.truncate(size)  # sparse, as the scale harness's files
    data = os.urandom(2 * PART)
    (tmp_path / "data").write_bytes(data)
    store = _store(s3_env, discarding.endpoint)
    store.upload_many([(str(tmp_path / "zeros"), "step-1/zeros"), (str(tmp_path / "data"), "step-1/data")])
    direct = open_store(store.url(), endpoint_url=s3_env.endpoint)
    assert direct.cat("step-1/zeros") == b"" and direct.cat("step-1/data") == data  # the store holds no zeros
    assert store.cat("step-1/zeros") == bytes(size) and store.cat("step-1/data") == data
    assert store.read_ranges([("step-1/zeros", PART, 10), ("step-1/data", 5, 10)]) == [bytes(10), data[5:15]]
    assert {e.name.rsplit("/", 1)[-1]: e.size for e in store.ls("step-1")} == {"zeros": size, "data": len(data)}
    assert not store.create_bytes("step-1/zeros", b"x") and store.cat("step-1/zeros") == bytes(size)  # 412: kept
    store.download_many([("step-1/zeros", str(tmp_path / "back"), size)])
    assert (tmp_path / "back").read_bytes() == bytes(size)
    store.rm_files(["step-1/zeros"])
    assert discarding.zeros is not None and discarding.zeros.objects == {} and not store.exists("step-1/zeros")


def test_discard_needs_assemble() -> None:
    with pytest.raises(BadConfig, match="discard: only with assemble"):
        Server(0, ("127.0.0.1", 1), Throttle(Config()), discard=Zeros())
