"""S3 downloads on plain ``http.client`` threads with presigned GET URLs.

Restoring is CPU-bound on small machines; this path does the least work per byte: each
worker thread streams a response with ``readinto`` into a small reusable buffer (the GIL is
released while it waits), writes it with ``os.write``/``os.pwrite`` and hashes the same
buffer -- no per-chunk Python objects, no joined copies. Files are fetched in parallel; a
large file being written to disk is split into ranges fetched in parallel and hashed
afterwards from the page cache.

URLs are presigned locally by botocore with the store's credentials (no request, nothing
logged). Set SLURM_TITAN_CKPT_FAST_GET=0 to use the aiobotocore path instead.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from slurm_titan.errors import StorageError

from .checksum import new_hasher
from .store import Progress, Store, StoreError

_BUF = 256 << 10
_TRIES = 4
_RANGED_MIN = 96 << 20  # files at least this large are fetched as parallel ranges


def enabled(store: Store) -> bool:
    return store.is_s3 and os.environ.get("SLURM_TITAN_CKPT_FAST_GET", "1") != "0"


class _Transient(Exception):
    pass


@dataclass
class _File:
    rel: str
    local_path: str | None
    size: int | None
    url: Any
    parts_left: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: tuple[int, str] | BaseException | None = None
    fd: int = -1


class _Reader:
    def __init__(self, store: Store, algorithm: str, progress: Progress) -> None:
        self.store, self.algorithm, self.progress = store, algorithm, progress
        self.local = threading.local()
        self.timeout = 300.0
        self.all_conns: list[http.client.HTTPConnection] = []
        self.all_lock = threading.Lock()

    # -- connections ------------------------------------------------------------------
    def _conn(self, url: Any, fresh: bool = False) -> http.client.HTTPConnection:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        key = (url.scheme, url.netloc)
        conn = conns.get(key)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            conn = cls(url.hostname, url.port, timeout=self.timeout)
            conns[key] = conn
            with self.all_lock:
                self.all_conns.append(conn)
        return conn

    def close(self) -> None:
        with self.all_lock:
            for conn in self.all_conns:
                conn.close()
            self.all_conns.clear()

    def _request(self, f: _File, headers: dict[str, str], attempt: int) -> http.client.HTTPResponse:
        conn = self._conn(f.url, fresh=attempt > 0)
        target = f.url.path + (f"?{f.url.query}" if f.url.query else "")
        try:
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Transient(_why(e, self.store)) from None
        if resp.status in (200, 206):
            return resp
        body = resp.read(2048)
        code = _xml_code(body) or f"HTTP {resp.status}"
        if resp.status >= 500 or code in ("SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError"):
            raise _Transient(code)
        if resp.status == 404:
            raise StoreError(f"{self.store.url(f.rel)}: no such object")
        if resp.status == 403:
            raise StoreError(f"{self.store.location}: cannot read {f.rel}: access denied ({code}); check the "
                             f"credentials")
        raise StoreError(f"{self.store.url(f.rel)}: read failed: {code}")

    def _stream(self, f: _File, headers: dict[str, str], expect: int | None, sink, attempt: int) -> int:
        resp = self._request(f, headers, attempt)
        length = resp.getheader("Content-Length")
        expect = int(length) if length is not None else expect
        buf = bytearray(_BUF)
        mv = memoryview(buf)
        got = 0
        try:
            while True:
                n = resp.readinto(buf)
                if not n:
                    break
                sink(mv[:n], got)
                got += n
                self.progress(n)
        except (OSError, http.client.HTTPException) as e:
            self._conn(f.url).close()
            raise _Transient(_why(e, self.store)) from None
        if expect is not None and got != expect:
            self._conn(f.url).close()
            raise _Transient(f"short read: {got} of {expect} bytes")
        return got

    def _retry(self, what: str, fn):
        delay = 0.2
        for attempt in range(_TRIES):
            try:
                return fn(attempt)
            except _Transient as e:
                if attempt == _TRIES - 1:
                    raise StoreError(f"{self.store.location}: {what}: {e}", transient=True) from None
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    # -- tasks ------------------------------------------------------------------------
    def whole(self, f: _File) -> tuple[int, str]:
        def once(attempt: int) -> tuple[int, str]:
            h = new_hasher(self.algorithm)
            if f.fd >= 0:
                os.lseek(f.fd, 0, os.SEEK_SET)
                os.ftruncate(f.fd, 0)
                fd = f.fd

                def sink(chunk: memoryview, _off: int) -> None:
                    h.update(chunk)
                    view = chunk
                    while view:
                        view = view[os.write(fd, view):]
            else:
                def sink(chunk: memoryview, _off: int) -> None:
                    h.update(chunk)

            size = self._stream(f, {}, f.size, sink, attempt)
            return size, h.hexdigest()

        return self._retry(f"cannot read {f.rel}", once)

    def part(self, f: _File, off: int, length: int) -> None:
        def once(attempt: int) -> None:
            def sink(chunk: memoryview, pos: int) -> None:
                view, at = chunk, off + pos
                while view:
                    k = os.pwrite(f.fd, view, at)
                    view, at = view[k:], at + k

            self._stream(f, {"Range": f"bytes={off}-{off + length - 1}"}, length, sink, attempt)

        self._retry(f"cannot read {f.rel}", once)


def _why(e: BaseException, store: Store) -> str:
    if isinstance(e, ConnectionRefusedError):
        return f"cannot connect to {store.endpoint or 'the endpoint'} (unreachable or not running)"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(e).__name__}: {e}"


def _xml_code(body: bytes) -> str:
    start = body.find(b"<Code>")
    end = body.find(b"</Code>")
    return body[start + 6:end].decode(errors="replace") if 0 <= start < end else ""


def read_many(store: Store, items: list[tuple[str, str | None, int | None]], algorithm: str, progress: Progress,
              return_exceptions: bool = False) -> list[Any]:
    """Fetch [(rel, local path or None, size or None)] -> [(size, checksum)] in order.

    With ``local_path`` None the object is only hashed. Raises (or, with return_exceptions,
    returns per item) StoreError/StorageError."""
    from .checksum import hash_file

    with store.errors("cannot presign the download URLs"):
        files = [_File(rel, lp, size, urlsplit(store.fs.url(store.full(rel), expires=6 * 3600)))
                 for rel, lp, size in items]
    reader = _Reader(store, algorithm, progress)
    part_size = max(store.transfer.part_size, 8 << 20)
    workers = max(1, store.transfer.concurrency)

    def run_whole(f: _File) -> None:
        try:
            f.result = reader.whole(f)
        except BaseException as e:  # noqa: BLE001
            f.result = e

    def run_part(f: _File, off: int, length: int) -> None:
        err: BaseException | None = None
        try:
            reader.part(f, off, length)
        except BaseException as e:  # noqa: BLE001
            err = e
        with f.lock:
            if err is not None and not isinstance(f.result, BaseException):
                f.result = err
            f.parts_left -= 1
            last = f.parts_left == 0
        if last and not isinstance(f.result, BaseException):
            try:
                f.result = hash_file(f.local_path, algorithm)  # type: ignore[arg-type]
            except OSError as e:
                f.result = StorageError(f"cannot read back {f.local_path}: {e.strerror}")

    try:
        for f in files:
            if f.local_path is not None:
                try:
                    os.makedirs(os.path.dirname(f.local_path) or ".", exist_ok=True)
                    f.fd = os.open(f.local_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                except OSError as e:
                    raise StorageError(f"cannot write {f.local_path}: {e.strerror}") from None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-get") as pool:
            futures = []
            # big files first, split into ranges; small ones streamed whole
            for f in sorted(files, key=lambda f: -(f.size or 0)):
                if f.fd >= 0 and f.size is not None and f.size >= _RANGED_MIN:
                    offsets = list(range(0, f.size, part_size))
                    f.parts_left = len(offsets)
                    os.ftruncate(f.fd, f.size)
                    futures += [pool.submit(run_part, f, off, min(part_size, f.size - off)) for off in offsets]
                else:
                    futures.append(pool.submit(run_whole, f))
            for fut in futures:
                fut.result()
    finally:
        reader.close()
        for f in files:
            if f.fd >= 0:
                os.close(f.fd)
    out = []
    for f in files:
        if isinstance(f.result, BaseException) and not return_exceptions:
            raise f.result
        out.append(f.result)
    return out
