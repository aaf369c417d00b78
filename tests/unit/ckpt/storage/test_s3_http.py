"""The fast S3 path's body reads: a connection lost in the middle of a body is a transient failure
(retried on a fresh connection), whatever the socket says."""

from __future__ import annotations

import errno
import http.client
from types import SimpleNamespace

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


class _Conns(s3_http._Http):
    """The per-thread connections, with ``request`` handing out ``resp``; counts closes."""

    def __init__(self, resp: _Lost) -> None:
        super().__init__(SimpleNamespace(location="s3://bucket/run", endpoint=None))  # type: ignore[arg-type]
        self.resp, self.closed = resp, 0

    def request(self, *args: object, **kwargs: object) -> _Lost:  # type: ignore[override]
        return self.resp

    def conn(self, url: object) -> _Conns:  # type: ignore[override]
        return self

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("exc", [ConnectionResetError(errno.ECONNRESET, "reset by peer"), TimeoutError("timed out"),
                                 http.client.IncompleteRead(b"", 1000)])
def test_a_connection_lost_mid_body_is_transient(exc):
    conns = _Conns(_Lost(exc))
    get = s3_http._Get("step-1/f.distcp", None, None, url=None)
    with pytest.raises(TransientStoreError, match="^s3://bucket/run: cannot read step-1/f.distcp: ") as e:
        s3_http._stream(conns, get, {}, None, None, lambda n: None)
    assert not e.value.throttled
    assert conns.closed == 1  # the connection is not reused
