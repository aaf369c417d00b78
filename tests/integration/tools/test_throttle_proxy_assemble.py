"""The throttling proxy keeping multipart parts under S3's 5 MiB (tools/local_s3/throttle_proxy.py, ``assemble``), in
front of SeaweedFS (which refuses such parts at completion): the project's own S3 upload through it, in 1 KiB parts.
Outcomes and counts only."""

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
from tools.local_s3.throttle_proxy import Config, Server, Throttle

pytestmark = pytest.mark.s3

PART = 1 << 10


@pytest.fixture
def proxy(s3_env: S3Server) -> Iterator[Server]:
    """A proxy in front of the shared server that assembles parts; its first assembly fails (the store times out)."""
    host, port = s3_env.endpoint.removeprefix("http://").split(":")
    failures = [OSError("timed out")]

    def assemble(path: str, body: bytes) -> tuple[int, bytes]:
        if failures:
            raise failures.pop()
        return s3_env.server.request("PUT", path, body=body, timeout=30)

    server = Server(0, (host, int(port)), Throttle(Config()), keep_requests=True, assemble=assemble)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


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
