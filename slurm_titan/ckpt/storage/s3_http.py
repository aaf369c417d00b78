"""S3 transfers on plain ``http.client`` threads with presigned URLs (the fast path).

On small machines moving checkpoints is CPU-bound, so this path does the least work per
byte: worker threads send and receive straight from/into reusable buffers (``sendall`` of
a memoryview, ``readinto``), the GIL is released while they wait, and each byte is hashed
once from the same buffer -- no per-chunk Python objects, no joined copies, no per-request
SigV4 payload hashing (presigned URLs carry UNSIGNED-PAYLOAD; integrity is end to end by
the checksums in the commit record, verified on every restore).

- upload: the caller's thread reads each file part by part into a pool of ``concurrency``
  buffers, hashing in order, while workers PUT the parts (multipart above one part). A body of
  1 MiB or more (``TransferConfig.expect_continue_min``) is sent only once the store answers
  ``Expect: 100-continue``, so that a refused PUT (503 SlowDown) costs no body bytes.
- download: a large file being written to disk is split into ranges fetched in parallel into
  page-aligned buffers, written past the page cache and hashed in file order as they land
  (:mod:`.ranged`); a small file, or one only being hashed (verify), is streamed whole and
  hashed on the way.

Each request (a part, a range, a whole small file) is retried alone under the store's policy
(:mod:`.backoff`: a throttling store is waited out, honouring its ``Retry-After``), in a slot of the
store's adaptive concurrency (:mod:`.concurrency`).

URLs are presigned locally by botocore with the store's credentials (no request; URLs are
never logged). Create/complete/abort of multipart uploads go through s3fs. Set
SLURM_TITAN_CKPT_FAST_S3=0 to move files through s3fs instead (:class:`.s3.S3Store`); that is
also the choice when an HTTP proxy is configured (http.client does not do proxies) or the TLS
verification is customized.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import queue
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from slurm_titan import envvars
from slurm_titan.ckpt.checksum import BlockHasher, new_hasher
from slurm_titan.ckpt.manifest import FileEntry
from slurm_titan.ckpt.storage.base import Progress, RangeReader, Spans, Uploaded
from slurm_titan.ckpt.storage.errors import (
    LocalFileError,
    StoreError,
    TransientStoreError,
    open_local,
    parse_retry_after,
    throttle_answer,
)
from slurm_titan.ckpt.storage.ranged import ALIGN, Budget, PartBuffers, RangedFile
from slurm_titan.ckpt.storage.s3 import S3Store
from slurm_titan.errors import StorageError

T = TypeVar("T")

_BUF = 256 << 10
_CONTINUE_WAIT_S = 1.0
"""How long a PUT waits for ``100 Continue`` before it sends its body anyway (RFC 9110 10.1.1)."""
_RANGED_MIN = 16 << 20
"""Files at least this large (and over two parts) are downloaded as parallel ranges: measured
~1.6x faster than one stream per file on SeaweedFS."""
MAX_PARTS = 9000
_EXPIRES = 6 * 3600


def usable(fs: Any) -> bool:
    """Whether this path can serve an s3fs filesystem: not turned off (SLURM_TITAN_CKPT_FAST_S3=0),
    no HTTP proxy, no custom TLS verification."""
    if os.environ.get(envvars.CKPT_FAST_S3, "1") == "0":
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return False
    return "verify" not in (getattr(fs, "client_kwargs", None) or {})


class S3HttpStore(S3Store):
    """:class:`.s3.S3Store` whose files move on http.client threads with presigned URLs."""

    def _upload_many(self, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                     spans: Spans, uploaded: Uploaded) -> list[FileEntry]:
        return upload_many(self, items, algorithm, progress, spans, uploaded)

    def _download_many(self, items: list[tuple[str, str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str]]:
        return read_many(self, items, algorithm, progress)

    def _checksum_many(self, items: list[tuple[str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str] | Exception]:
        return read_many(self, [(r, None, s) for r, s in items], algorithm, progress, return_exceptions=True)

    def _range_reader(self) -> RangeReader:
        return HttpRangeReader(self)


class _Http:
    """Per-thread keep-alive connections; failures worth retrying raise TransientStoreError."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.local = threading.local()
        self.all: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def conn(self, url: Any) -> http.client.HTTPConnection:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        key = (url.scheme, url.netloc)
        conn = conns.get(key)
        if conn is None:
            if url.scheme == "https":
                conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=300,
                                                   context=_ssl_context(os.environ.get("AWS_CA_BUNDLE") or None))
            else:
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
            conns[key] = conn
            with self.lock:
                self.all.append(conn)
        return conn

    def close(self) -> None:
        with self.lock:
            for c in self.all:
                c.close()
            self.all.clear()

    def request(self, method: str, url: Any, rel: str, headers: dict[str, str] | None = None,
                body: Any = None) -> http.client.HTTPResponse:
        """One request; a connection that failed, or whose answer was not read whole, is closed (http.client
        opens a new one for the next request)."""
        conn = self.conn(url)
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            if body is not None and len(body) >= self.store.transfer.expect_continue_min:
                resp = self._put_after_continue(conn, method, target, rel, headers or {}, body)
            else:
                conn.request(method, target, body=body, headers=headers or {})
                resp = conn.getresponse()
            if resp.status in (200, 204, 206):
                return resp
            text = resp.read(4096)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise self.fail(method, rel, self.why(e)) from None
        if not resp.isclosed():
            conn.close()
        raise self.refused(method, rel, resp.status, resp.getheader("Retry-After"), text)

    def _put_after_continue(self, conn: http.client.HTTPConnection, method: str, target: str, rel: str,
                            headers: dict[str, str], body: Any) -> http.client.HTTPResponse:
        """Send the headers with ``Expect: 100-continue`` and the body once the store says ``100 Continue``
        (or nothing within :data:`_CONTINUE_WAIT_S`); a store that answers at once (503 SlowDown) is
        refused() without a byte of the body sent, and the connection closed (the store may still wait for
        the body)."""
        conn.putrequest(method, target, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Expect", "100-continue")
        conn.endheaders()
        sock = conn.sock
        with sock.makefile("rb") as fp:
            sock.settimeout(_CONTINUE_WAIT_S)
            try:
                line = fp.readline(65537)
            except TimeoutError:
                line = None  # no interim answer: send the body anyway
            finally:
                sock.settimeout(conn.timeout)
            if line is not None:
                parts = line.split(None, 2)
                if len(parts) < 2 or not parts[1].isdigit():
                    raise http.client.BadStatusLine(repr(line))
                status = int(parts[1])
                head = http.client.parse_headers(fp)
                if status >= 200:
                    text = fp.read(min(int(head.get("Content-Length") or 0), 4096))
                    conn.close()
                    raise self.refused(method, rel, status, head.get("Retry-After"), text)
        conn.send(body)
        return conn.getresponse()

    def fail(self, method: str, rel: str, why: str, *, throttle: str = "",
             retry_after: float | None = None) -> TransientStoreError:
        """A transient failure of a request for ``rel``: ``<location>: cannot read|upload <rel>: <why>``."""
        verb = "cannot read" if method == "GET" else "cannot upload"
        return TransientStoreError(f"{self.store.location}: {verb} {rel}: {why}", throttle=throttle,
                                   retry_after=retry_after)

    def refused(self, method: str, rel: str, status: int, retry_after: str | None, text: bytes) -> StoreError:
        """The error for a store's answer other than 2xx (``text``: the start of its body)."""
        code = _xml_code(text) or f"HTTP {status}"
        throttle = throttle_answer(status, code)
        if throttle or status >= 500 or code in ("RequestTimeout", "InternalError"):
            return self.fail(method, rel, code, throttle=throttle, retry_after=parse_retry_after(retry_after))
        if status == 404:
            return StoreError(f"{self.store.url(rel)}: no such object ({code})")
        if status == 403:
            return StoreError(f"{self.store.location}: {rel}: access denied ({code}); check the credentials")
        return StoreError(f"{self.store.url(rel)}: {method} failed: {code}")

    def why(self, e: BaseException) -> str:
        if isinstance(e, ConnectionRefusedError):
            return f"cannot connect to {self.store.endpoint or 'the endpoint'} (unreachable or not running)"
        if isinstance(e, (socket.timeout, TimeoutError)):
            return "timed out"
        return f"{type(e).__name__}: {e}"

    def retry(self, what: str, fn: Callable[[], T], *, upload: bool = False) -> T:
        """``fn()``, one request, retried alone under the store's policy in a slot of its concurrency (an
        ``upload`` at its pace)."""
        return self.store._request(what, lambda _attempt: fn(), upload=upload)


@functools.lru_cache(maxsize=4)
def _ssl_context(cafile: str | None) -> ssl.SSLContext:
    """One TLS context per CA bundle for the process: loading a bundle costs ~50 ms of CPU."""
    return ssl.create_default_context(cafile=cafile)


class _SpareBuffers:
    """Part buffers kept from one upload to the next: a rank uploads every checkpoint, and
    allocating (and faulting in) concurrency x part_size each time costs CPU that training wants.
    Holds at most ``limit`` buffers (the largest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free: list[bytearray] = []
        self.lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        with self.lock:  # the smallest that fits (the list is largest first)
            for i in range(len(self.free) - 1, -1, -1):
                if len(self.free[i]) >= size:
                    return self.free.pop(i)
        return bytearray(size)

    def keep(self, bufs: list[bytearray]) -> None:
        with self.lock:
            self.free = sorted(self.free + bufs, key=len, reverse=True)[:self.limit]


_spare = _SpareBuffers(limit=8)


def _xml_code(body: bytes) -> str:
    start, end = body.find(b"<Code>"), body.find(b"</Code>")
    return body[start + 6:end].decode(errors="replace") if 0 <= start < end else ""


def _presign(store: S3Store, method: str, params: dict[str, Any]) -> Any:
    from fsspec.asyn import sync

    fs = store.fs
    url = sync(fs.loop, fs.s3.generate_presigned_url, method, Params=params, ExpiresIn=_EXPIRES)
    return urlsplit(url)


# ------------------------------------------------------------------------------ download


@dataclass
class _Get:
    rel: str
    local_path: str | None
    size: int | None
    url: Any
    parts_left: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: tuple[int, str] | BaseException | None = None
    fd: int = -1
    ranged: RangedFile | None = None


def _stream(web: _Http, g: _Get, headers: dict[str, str], expect: int | None,
            sink: Callable[[memoryview, int], None] | None, progress: Progress,
            into: memoryview | None = None) -> int:
    """GET the body through a small buffer, handing each piece to ``sink``, or (``into``)
    straight into the caller's buffer, which must hold it all; returns the bytes received."""
    resp = web.request("GET", g.url, g.rel, headers)
    length = resp.getheader("Content-Length")
    expect = int(length) if length is not None else expect
    mv = into if into is not None else memoryview(bytearray(_BUF))
    got = 0
    try:
        while True:
            at = got if into is not None else 0
            n = resp.readinto(mv[at:at + _BUF])
            if not n:
                break
            if sink is not None:
                sink(mv[:n], got)
            got += n
            progress(n)
    except (OSError, http.client.HTTPException) as e:
        web.conn(g.url).close()
        raise web.fail("GET", g.rel, web.why(e)) from None
    if expect is not None and got != expect:
        web.conn(g.url).close()
        raise web.fail("GET", g.rel, f"short read: {got} of {expect} bytes")
    return got


def read_many(store: S3Store, items: Sequence[tuple[str, str | None, int | None]], algorithm: str,
              progress: Progress, return_exceptions: bool = False) -> list[Any]:
    """Fetch [(rel, local path or None, size or None)] -> [(size, checksum)] in order.

    With ``local_path`` None the object is only hashed. Raises the first failure (or, with return_exceptions,
    returns per item) StoreError/StorageError. A failure ends the fetch: no request of those still waiting their
    turn is made (with return_exceptions: none of the same file's), so that a store refusing every request ends
    it in one retry budget, not one for every few ranges."""
    with store._guard("cannot presign the download URLs"):
        gets = []
        for rel, lp, size in items:
            bucket, key = store.bucket_key(rel)
            gets.append(_Get(rel, lp, size, _presign(store, "get_object", {"Bucket": bucket, "Key": key})))
    web = _Http(store)
    part_size = -(-store.transfer.part_size // ALIGN) * ALIGN
    conc = max(1, store.transfer.concurrency)
    buffers = PartBuffers(part_size)  # ranges in flight, and early ones (up to `early`)
    early = Budget(conc * part_size)
    failures: list[BaseException] = []

    def given_up(g: _Get) -> bool:
        return (bool(failures) and not return_exceptions) or isinstance(g.result, BaseException)

    def whole(g: _Get) -> None:
        def once() -> tuple[int, str]:
            h = new_hasher(algorithm)
            if g.fd >= 0:
                os.lseek(g.fd, 0, os.SEEK_SET)
                os.ftruncate(g.fd, 0)

                def sink(chunk: memoryview, _off: int) -> None:
                    h.update(chunk)
                    view = chunk
                    while view:
                        view = view[os.write(g.fd, view):]
            else:
                def sink(chunk: memoryview, _off: int) -> None:
                    h.update(chunk)
            size = _stream(web, g, {}, g.size, sink, progress)
            return size, h.hexdigest()

        if given_up(g):
            return
        try:
            g.result = web.retry(f"cannot read {g.rel}", once)
        except BaseException as e:  # noqa: BLE001
            g.result = e
            failures.append(e)

    def fetch_part(g: _Get, ranged: RangedFile, off: int, length: int) -> BaseException | None:
        buf = buffers.take()
        view = memoryview(buf)[:length]

        def once() -> None:
            _stream(web, g, {"Range": f"bytes={off}-{off + length - 1}"}, length, None, progress, view)

        try:
            web.retry(f"cannot read {g.rel}", once)
            ranged.write(off, view)
            buffers.give(ranged.landed(off, length, buf))
        except OSError as e:
            return StorageError(f"cannot write {g.local_path}: {e.strerror}")
        except BaseException as e:  # noqa: BLE001
            return e
        return None

    def part(g: _Get, ranged: RangedFile, off: int, length: int) -> None:
        err = None if given_up(g) else fetch_part(g, ranged, off, length)
        if err is not None:
            failures.append(err)
        with g.lock:
            if err is not None and not isinstance(g.result, BaseException):
                g.result = err
            g.parts_left -= 1
            last = g.parts_left == 0
        if last and not given_up(g):
            g.result = ranged.checksum()

    try:
        for g in gets:
            if g.local_path is not None:
                try:
                    os.makedirs(os.path.dirname(g.local_path) or ".", exist_ok=True)
                    g.fd = os.open(g.local_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                except OSError as e:
                    raise StorageError(f"cannot write {g.local_path}: {e.strerror}") from None
        with ThreadPoolExecutor(max_workers=conc, thread_name_prefix="ckpt-get") as pool:
            futures = []
            for g in sorted(gets, key=lambda g: -(g.size or 0)):  # big files first
                if g.fd >= 0 and g.size is not None and g.size >= max(_RANGED_MIN, 2 * part_size):
                    offsets = list(range(0, g.size, part_size))
                    g.parts_left = len(offsets)
                    os.ftruncate(g.fd, g.size)
                    g.ranged = RangedFile(g.fd, g.local_path, algorithm, early,  # type: ignore[arg-type]
                                          direct=store.transfer.direct_io)
                    futures += [pool.submit(part, g, g.ranged, off, min(part_size, g.size - off)) for off in offsets]
                else:
                    futures.append(pool.submit(whole, g))
            for fut in futures:
                fut.result()
    finally:
        web.close()
        for g in gets:
            if g.ranged is not None:
                g.ranged.close()
            if g.fd >= 0:
                os.close(g.fd)
        buffers.close()
    if failures and not return_exceptions:
        raise failures[0]
    return [g.result for g in gets]


# ------------------------------------------------------------------------------ upload


def upload_many(store: S3Store, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                spans: Spans, uploaded: Uploaded) -> list[FileEntry]:
    """Upload [(local path, rel)] -> FileEntries (size and checksum of the bytes sent), in order,
    telling ``uploaded`` of each file stored whole (those before a failure and after it too).

    Raises LocalFileError for unreadable local files, StoreError for store failures (a part's
    once the store's policy for it is used up)."""
    fs = store.fs
    web = _Http(store)
    conc = max(1, store.transfer.concurrency)
    base_part = max(store.transfer.part_size, store.transfer.min_part_size)
    buffers: queue.Queue[bytearray] = queue.Queue()
    made = 0
    errors: list[BaseException] = []
    entries: list[FileEntry] = []
    open_mpus: list[tuple[str, str, str]] = []

    def take(size: int) -> bytearray:
        nonlocal made
        try:
            buf = buffers.get_nowait()
        except queue.Empty:
            if made < conc:
                made += 1
                return _spare.take(size)
            buf = buffers.get()
        if len(buf) < size:
            buf = bytearray(size)
        return buf

    def put(url: Any, rel: str, buf: bytearray, n: int) -> str:
        def once() -> str:
            resp = web.request("PUT", url, rel, {"Content-Length": str(n)}, memoryview(buf)[:n])
            etag = resp.getheader("ETag") or ""
            resp.read()
            return etag

        try:
            etag = web.retry(f"cannot upload {rel}", once, upload=True)
            progress(n)
            return etag
        except BaseException as e:
            errors.append(e)
            raise
        finally:
            buffers.put(buf)

    def complete(entry: FileEntry, upload_id: str, etags: list[str]) -> None:
        bucket, key = store.bucket_key(entry.path)
        store._retried(f"cannot complete the upload of {entry.path}", lambda: fs.call_s3(
            "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]}))
        open_mpus.remove((bucket, key, upload_id))

    def read_into(f: Any, buf: bytearray, n: int, h: Any, path: str) -> int:
        view = memoryview(buf)[:n]
        got = 0
        try:
            while got < n:
                k = f.readinto(view[got:])
                if not k:
                    break
                got += k
        except OSError as e:
            raise LocalFileError(f"cannot read {path}: {e.strerror}") from None
        h.update(view[:got])
        return got

    try:
        with ThreadPoolExecutor(max_workers=conc, thread_name_prefix="ckpt-put") as pool:
            pending: list[tuple[int, str | None, list[Future]]] = []
            for local_path, rel in items:
                if errors:
                    break
                bucket, key = store.bucket_key(rel)
                with open_local(local_path) as f:
                    size = os.fstat(f.fileno()).st_size
                    part_size = max(base_part, -(-size // MAX_PARTS))
                    h = BlockHasher(algorithm, store.transfer.block_size, spans.get(rel, ()))
                    if size <= part_size:
                        buf = take(max(size, 1))
                        n = read_into(f, buf, size, h, local_path)
                        with store._guard(f"cannot upload {rel}"):
                            url = _presign(store, "put_object", {"Bucket": bucket, "Key": key})
                        futs = [pool.submit(put, url, rel, buf, n)]
                        entries.append(FileEntry.hashed(rel, n, h))
                        pending.append((len(entries) - 1, None, futs))
                        continue
                    upload_id = store._retried(f"cannot upload {rel}", functools.partial(
                        fs.call_s3, "create_multipart_upload", Bucket=bucket, Key=key))["UploadId"]
                    open_mpus.append((bucket, key, upload_id))
                    futs = []
                    total, number = 0, 0
                    while total < size and not errors:
                        buf = take(part_size)
                        n = read_into(f, buf, min(part_size, size - total), h, local_path)
                        if not n:
                            buffers.put(buf)
                            break
                        number += 1
                        total += n
                        with store._guard(f"cannot upload {rel}"):
                            url = _presign(store, "upload_part", {"Bucket": bucket, "Key": key, "UploadId": upload_id,
                                                                  "PartNumber": number})
                        futs.append(pool.submit(put, url, rel, buf, n))
                    entries.append(FileEntry.hashed(rel, total, h))
                    pending.append((len(entries) - 1, upload_id, futs))
            for index, upload_id, futs in pending:
                try:
                    etags = [fu.result() for fu in futs]
                    if upload_id is not None:
                        complete(entries[index], upload_id, etags)
                except Exception as e:  # noqa: BLE001 - the first failure is raised below, after the other files
                    if e not in errors:
                        errors.append(e)
                    continue
                uploaded(entries[index])
    finally:
        web.close()
        _spare.keep([buffers.get_nowait() for _ in range(buffers.qsize())])
        for bucket, key, upload_id in open_mpus:  # failed: do not leave parts behind
            with contextlib.suppress(Exception):
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    if errors:
        raise errors[0]
    return entries


# ------------------------------------------------------------------------------ ranges


class HttpRangeReader:
    """Ranged GETs of objects into the caller's buffers (presigned once per object), for the
    restore of a node's share (:meth:`.base.Store.download_pieces`). Thread-safe."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.http = _Http(store)
        self.gets: dict[str, _Get] = {}
        self.lock = threading.Lock()

    def read(self, rel: str, off: int, view: memoryview, progress: Progress) -> int:
        with self.lock:
            g = self.gets.get(rel)
            if g is None:
                with self.store._guard(f"cannot presign the download URL of {rel}"):
                    bucket, key = self.store.bucket_key(rel)
                    g = self.gets[rel] = _Get(rel, None, None, _presign(self.store, "get_object",
                                                                       {"Bucket": bucket, "Key": key}))
        return _stream(self.http, g, {"Range": f"bytes={off}-{off + len(view) - 1}"}, len(view), None, progress, view)

    def close(self) -> None:
        self.http.close()
