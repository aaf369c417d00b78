"""Start and stop a moto S3 emulator on loopback (stdlib only), beside :mod:`.seaweed`.

moto (``pip install "moto[server]"``) answers the S3 API from memory, accepts any key pair and,
unlike some real servers, enforces conditional writes (If-None-Match): a second store to run the
storage contract suite on (tests/integration/storage/test_contract.py). Objects live in the
server's memory (about 5 GiB moving 1 GiB): keep them small.

    with Server(port=free_port()) as s3:
        s3.env()          # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
        s3.reset()        # every bucket gone, the test bucket made again
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tools.local_s3.seaweed import pdeathsig


def find_moto_server() -> str:
    """Path of ``moto_server``: next to this Python, or on PATH."""
    for c in (str(Path(sys.executable).parent / "moto_server"), shutil.which("moto_server") or ""):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError('moto_server not found: pip install "moto[server]"')


def free_port() -> int:
    """A free loopback port (picked by the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    port: int
    bucket: str = "slurm-titan"
    access_key: str = "AKMOTOTEST"
    secret_key: str = "moto-test-secret"
    region: str = "us-east-1"
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def start(self, timeout: float = 30.0, die_with_parent: bool = True) -> Server:
        """Start ``moto_server`` in its own session and wait until the bucket exists.

        ``die_with_parent``: the kernel stops it when the starting process dies (Linux)."""
        with tempfile.TemporaryFile() as log:
            self.proc = subprocess.Popen([find_moto_server(), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=pdeathsig if die_with_parent else None)
            try:
                self._wait_ready(timeout, log)
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (then SIGKILL) the server; leaves nothing running."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def reset(self) -> None:
        """Forget every object and bucket (``POST /moto-api/reset``), then make the bucket again."""
        self._request("POST", "/moto-api/reset")
        self._request("PUT", f"/{self.bucket}")

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self, timeout: float, log: IO[bytes]) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log.seek(0)
                out = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}: {out}")
            try:
                self._request("PUT", f"/{self.bucket}")
                return
            except OSError as e:
                last = str(e)
            time.sleep(0.1)
        raise TimeoutError(f"moto_server on port {self.port} not ready after {timeout:.0f} s ({last})")

    def _request(self, method: str, path: str) -> int:
        req = urllib.request.Request(self.endpoint + path, data=b"" if method != "GET" else None, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            if e.code == 409:  # BucketAlreadyOwnedByYou
                return e.code
            raise OSError(f"HTTP {e.code} for {method} {path}") from None
