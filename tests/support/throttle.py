"""The throttling S3 proxy (tools/local_s3/throttle_proxy.py) in a child process, for tests.

    from tests.support.throttle import ThrottleProxy   # throttled_s3: a fixture (tests/conftest.py registers it)

    def test_x(throttled_s3):                # a proxy in front of the session's SeaweedFS, throttling nothing yet
        throttled_s3.configure(share=0.5)    # half of the requests from now on: 503 SlowDown
        env = throttled_s3.env()             # AWS_ENDPOINT_URL pointing at the proxy, the store's credentials
        throttled_s3.stats()["PUT"]["bytes_in"]

    with ThrottleProxy(server.endpoint, share=1.0, paths=r"\\.distcp") as proxy:   # one of your own
        proxy.endpoint                       # http://127.0.0.1:<port>

The proxy listens on a free loopback port, exits with the test process (the kernel sends it SIGTERM
when the thread that started it exits) and after ``max_lifetime`` seconds at the latest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3 import S3Server
from tools.local_s3.seaweed import pdeathsig

REPO = Path(__file__).resolve().parents[2]


class ThrottleProxy:
    """A throttle_proxy child process in front of ``upstream`` (an http:// loopback endpoint); ``config``: its keys
    (share, rate, burst, methods, paths, retry_after, latency, hold)."""

    def __init__(self, upstream: str, *, max_lifetime: float = 1800.0, seed: int | None = 0, **config: Any) -> None:
        self.upstream, self.max_lifetime, self.seed, self.config = upstream, max_lifetime, seed, config
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def start(self) -> ThrottleProxy:
        argv = [sys.executable, "-m", "tools.local_s3.throttle_proxy", "--upstream", self.upstream,
                "--max-lifetime", str(self.max_lifetime), "--config", json.dumps(self.config)]
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL, preexec_fn=pdeathsig)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"the throttle proxy did not start: {line.strip()} {err.strip()}")
        self.endpoint = line.split()[1]
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
            self.proc = None

    def __enter__(self) -> ThrottleProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.endpoint}/__proxy__/{what}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change some config keys (the others keep their values); returns the whole config."""
        return self._call("POST", "config", changes)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per method: requests, throttled, bytes_in (request bodies received), bytes_out (response bodies sent)."""
        return self._call("GET", "stats")["methods"]

    def held(self) -> dict[str, list]:
        """Requests held now (``waiting``: their paths) and released (``released``: [path, the store's status])."""
        return self._call("GET", "stats")["held"]

    def reset(self) -> None:
        """Zero the counters."""
        self._call("POST", "reset", {})


class ThrottledS3(ThrottleProxy):
    """A proxy in front of an :class:`~tests.support.s3.S3Server`; ``env()`` points clients at the proxy."""

    def __init__(self, server: S3Server, **kwargs: Any) -> None:
        super().__init__(server.endpoint, **kwargs)
        self.server = server

    def env(self) -> dict[str, str]:
        return dict(self.server.env(), AWS_ENDPOINT_URL=self.endpoint)

    def url(self, prefix: str = "") -> str:
        return self.server.url(prefix)

    def fresh_url(self, name: str = "t") -> str:
        return self.server.fresh_url(name)

    def storage_options(self) -> dict[str, str]:
        """The server's own, past the proxy (a test's cleanup is never throttled)."""
        return self.server.storage_options()

    def vacuum(self) -> None:
        self.server.vacuum()


@pytest.fixture
def throttled_s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThrottledS3]:
    """A proxy of this test's in front of the shared SeaweedFS (throttling nothing until ``configure``), with
    AWS_ENDPOINT_URL and the credentials in the environment pointing at it."""
    with ThrottledS3(s3_server) as proxy:
        for k, v in proxy.env().items():
            monkeypatch.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(k, raising=False)
        yield proxy
