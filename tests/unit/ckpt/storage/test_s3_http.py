"""The fast S3 path's body reads: a connection lost in the middle of a body is a transient failure
(retried on a fresh connection), whatever the socket says."""

from __future__ import annotations

import errno
import http.client

import pytest

from slurm_titan.ckpt.storage import TransientStoreError, s3_http


class _Lost:
    """A response whose body read fails: what a reset or a timed-out socket gives ``readinto``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def getheader(self, name: str) -> str:
        return "1000"

    def readinto(self, view: memoryview) -> int:
        raise self.exc


class _Conns:
    """Stands in for the per-thread connections: hands out ``resp``, counts closes."""

    def __init__(self, resp: _Lost) -> None:
        self.resp, self.closed = resp, 0

    def request(self, *args: object, **kwargs: object) -> _Lost:
        return self.resp

    def conn(self, url: object) -> _Conns:
        return self

    def close(self) -> None:
        self.closed += 1

    def why(self, e: BaseException) -> str:
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("exc", [ConnectionResetError(errno.ECONNRESET, "reset by peer"), TimeoutError("timed out"),
                                 http.client.IncompleteRead(b"", 1000)])
def test_a_connection_lost_mid_body_is_transient(exc):
    conns = _Conns(_Lost(exc))
    get = s3_http._Get("step-1/f.distcp", None, None, url=None)
    with pytest.raises(TransientStoreError):
        s3_http._stream(conns, get, {}, None, None, lambda n: None, attempt=0)  # type: ignore[arg-type]
    assert conns.closed == 1  # the connection is not reused
