"""A throttling reverse proxy in front of a local S3 store (the bundled SeaweedFS), for tests and benchmarks.

    python -m tools.local_s3.throttle_proxy --upstream http://127.0.0.1:8333 --share 0.5
    tools/local-s3 throttle --share 0.5       # in front of tools/local-s3's store (see tools/local_s3/cli.py)
    tests/support/throttle.py                 # the same in a child process, from a test (ThrottleProxy)

It listens on 127.0.0.1 only, and forwards only to a loopback upstream. It answers a share of the
requests (``share``), and every request beyond a token bucket per key prefix (``rate`` requests per
second, ``burst``; the prefix is the path up to its last ``/``), with S3's own ``503 SlowDown``
(its XML body and a ``Retry-After`` header), optionally only requests of some ``methods`` or whose
path matches the regular expression ``paths``; it adds ``latency`` seconds before each answer. Every
other request goes upstream unchanged, its Host header included (SigV4 signs it, and the store checks
the signature against the Host it receives), bodies streamed both ways in 256 KiB pieces.

A request that asks ``Expect: 100-continue`` is throttled before its body is sent, as S3 does: a
refused PUT then costs no body bytes; any other throttled request's body is read and dropped.

A PUT whose path matches ``hold`` (a regular expression) is read whole and held, not forwarded,
until the config no longer holds it; then it goes upstream whether or not its client is still there:
a write delayed in the network that lands after its writer is gone (a partitioned node's), as a test
of fenced writes needs it.

A proxy made in-process with ``assemble`` (a function that writes an object whole into the store: a signed
PutObject) keeps the parts of multipart uploads itself, answering each part as S3 does, and writes the object whole
at the upload's completion: a store that refuses parts under S3's 5 MiB (SeaweedFS) then takes scaled-down files cut
into as many parts as the real ones (the scale harness: tools/bench/scale_sim/store.py). The part requests are
throttled and counted as any other; an abort drops the kept parts and goes upstream. With ``discard`` as well (a
:class:`Zeros`, which the proxies of one store share), the bodies of zeros are not kept but counted (the harness's
files are sparse): an upload made of them alone is written upstream empty, and the proxy answers for it from its
size: zeros to a GET (its range), its size to a HEAD and in a listing. The store then holds none of a large sweep's
bytes, and every read still gets what was written.

Control (never throttled), for tests that change the store's mood between jobs:

    GET  /__proxy__/stats    {"methods": {"PUT": {"requests", "throttled", "bytes_in", "bytes_out"}}, "config",
                              "held": {"waiting": [path], "released": [[path, status]]}}
                             bytes_in: request bodies received, bytes_out: response bodies sent
    POST /__proxy__/config   a JSON object of config keys to change (the others keep their values)
    POST /__proxy__/reset    zeroes the counters

The proxy exits after ``--max-lifetime`` seconds (default 3600), or on SIGTERM/SIGINT, writing its
counters to ``--stats-file`` if given.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import html
import http.client
import ipaddress
import json
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

CONTROL = "/__proxy__/"
"""The control endpoint's paths (S3 bucket names have no underscores: no request of a client starts so)."""
_PIECE = 256 << 10
_METHODS = ("GET", "PUT", "POST", "DELETE", "HEAD")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
               "trailer", "transfer-encoding", "upgrade", "expect"}
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message><Resource>%s</Resource>"
              b"<RequestId>%s</RequestId></Error>")


class BadConfig(ValueError):
    """A config value that cannot be used; the message is one line naming where and which key."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """What the proxy throttles (see the module's docstring)."""

    share: float = 0.0
    """Of the matching requests, this share (0..1) is answered 503 SlowDown."""
    rate: float | None = None
    """Matching requests per second per key prefix beyond which the answer is 503 SlowDown (None: no limit)."""
    burst: float = 10.0
    """The token bucket's size: requests of one prefix that may come at once."""
    methods: tuple[str, ...] = ()
    """Only requests of these methods are throttled (empty: all)."""
    paths: str = ""
    """Only requests whose path (with its query) matches this regular expression are throttled (empty: all)."""
    retry_after: int | None = 1
    """The ``Retry-After`` of a 503 SlowDown, in seconds (None: no header)."""
    latency: float = 0.0
    """Seconds added before each answer (throttled or not)."""
    hold: str = ""
    """PUTs whose path (with its query) matches this regular expression are held (empty: none)."""

    def updated(self, changes: Mapping[str, Any], where: str) -> Config:
        """This config with ``changes`` (JSON values); BadConfig naming ``where`` and the key if one is wrong."""
        if not isinstance(changes, Mapping):
            raise BadConfig(f"{where}: expected a JSON object, got {type(changes).__name__}")
        known = {f for f in asdict(self)}
        values: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in known:
                raise BadConfig(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
            values[key] = _PARSERS[key](value, f"{where}: {key}")
        return replace(self, **values)

    def throttles(self, method: str, path: str) -> bool:
        """Whether a request of ``method`` for ``path`` is one this config may throttle."""
        return (not self.methods or method in self.methods) and (not self.paths or re.search(self.paths, path)
                                                                 is not None)

    def holds(self, method: str, path: str) -> bool:
        """Whether a request of ``method`` for ``path`` is held."""
        return method == "PUT" and bool(self.hold) and re.search(self.hold, path) is not None


def _number(value: Any, where: str, low: float, high: float = float("inf")) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadConfig(f"{where}: expected a number, got {value!r}")
    if not low <= value <= high:
        raise BadConfig(f"{where}: must be within [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _share(value: Any, where: str) -> float:
    return _number(value, where, 0.0, 1.0)


def _rate(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if _number(value, where, 0.0) == 0:
        raise BadConfig(f"{where}: must be > 0 (null: no limit), got {value!r}")
    return float(value)


def _burst(value: Any, where: str) -> float:
    return _number(value, where, 1.0)


def _methods(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise BadConfig(f"{where}: expected a list of methods, got {value!r}")
    unknown = [m for m in value if m.upper() not in _METHODS]
    if unknown:
        raise BadConfig(f"{where}: unknown method {unknown[0]!r} (known: {', '.join(_METHODS)})")
    return tuple(m.upper() for m in value)


def _paths(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadConfig(f"{where}: expected a regular expression, got {value!r}")
    try:
        re.compile(value)
    except re.error as e:
        raise BadConfig(f"{where}: not a regular expression ({e}): {value!r}") from None
    return value


def _retry_after(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadConfig(f"{where}: expected whole seconds >= 0 (null: no header), got {value!r}")
    return value


def _latency(value: Any, where: str) -> float:
    return _number(value, where, 0.0)


_PARSERS = {"share": _share, "rate": _rate, "burst": _burst, "methods": _methods, "paths": _paths,
            "retry_after": _retry_after, "latency": _latency, "hold": _paths}


def parse_upstream(url: str) -> tuple[str, int]:
    """(host, port) of an ``http://`` upstream on loopback; BadConfig otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise BadConfig(f"--upstream: expected http://<loopback address>:<port>, got {url!r}")
    return host, parts.port or 80


@dataclass(frozen=True)
class Request:
    """One answered request, as :class:`Counters` keeps it when asked to (an in-process proxy's harness reads them)."""

    at: float
    """``time.monotonic()`` when it was answered (one clock for every process of the machine)."""
    method: str
    path: str
    """With its query."""
    status: int
    bytes_in: int
    client: str = ""
    """Who asked: the ``client/<name>`` token of its User-Agent (botocore's ``user_agent_extra``), "" if none."""


_CLIENT = re.compile(r"\bclient/(\S+)")


class Counters:
    """Requests, throttled answers and body bytes per method, and with ``keep`` every request. Thread-safe."""

    FIELDS = ("requests", "throttled", "bytes_in", "bytes_out")

    def __init__(self, keep: bool = False) -> None:
        self.lock = threading.Lock()
        self.by_method: dict[str, dict[str, int]] = {}
        self.keep = keep
        self.requests: list[Request] = []

    def add(self, method: str, **counts: int) -> None:
        with self.lock:
            row = self.by_method.setdefault(method, dict.fromkeys(self.FIELDS, 0))
            for k, v in counts.items():
                row[k] += v

    def answered(self, method: str, path: str, status: int, bytes_in: int, bytes_out: int = 0, *,
                 user_agent: str = "") -> None:
        """Count one answered request (and keep it, with who asked: its ``user_agent``'s ``client/<name>``)."""
        self.add(method, requests=1, throttled=int(status == 503), bytes_in=bytes_in, bytes_out=bytes_out)
        if self.keep:
            client = _CLIENT.search(user_agent)
            with self.lock:
                self.requests.append(Request(time.monotonic(), method, path, status, bytes_in,
                                             client.group(1) if client else ""))

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {m: dict(row) for m, row in self.by_method.items()}

    def reset(self) -> None:
        with self.lock:
            self.by_method.clear()
            self.requests.clear()


class Throttle:
    """The proxy's config and its decisions (a seeded draw, a token bucket per prefix). Thread-safe."""

    def __init__(self, config: Config, seed: int | None = None) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.buckets: dict[str, tuple[float, float]] = {}  # prefix -> (tokens, when)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def set(self, config: Config) -> None:
        with self.lock:
            self.config = config
            self.buckets.clear()
            self.changed.notify_all()

    def wait_released(self, path: str) -> None:
        """Return once the config no longer holds a PUT of ``path``."""
        with self.changed:
            self.changed.wait_for(lambda: not self.config.holds("PUT", path))

    def decide(self, method: str, path: str, now: float | None = None) -> bool:
        """Whether to answer this request 503 SlowDown."""
        now = time.monotonic() if now is None else now
        with self.lock:
            c = self.config
            if not c.throttles(method, path):
                return False
            if c.share and self.rng.random() < c.share:
                return True
            if c.rate is None:
                return False
            prefix = path.split("?", 1)[0].rsplit("/", 1)[0]
            tokens, when = self.buckets.get(prefix, (c.burst, now))
            tokens = min(c.burst, tokens + (now - when) * c.rate)
            self.buckets[prefix] = (tokens - 1, now) if tokens >= 1 else (tokens, now)
            return tokens < 1


Assemble = Callable[[str, bytes], tuple[int, bytes]]
"""Writes an object whole into the store: (its URI-encoded path, its body) -> (status, the store's answer)."""


class Zeros:
    """The objects that proxies with ``discard`` wrote empty for their zeros, by path (``/bucket/key``): each one's
    size and ETag. One is shared by the proxies of one store (any of them may be asked for an object). Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, tuple[int, str]] = {}

    def get(self, path: str) -> tuple[int, str] | None:
        with self.lock:
            return self.objects.get(path)

    def keep(self, path: str, size: int, etag: str) -> None:
        with self.lock:
            self.objects[path] = (size, etag)

    def forget(self, path: str) -> None:
        with self.lock:
            self.objects.pop(path, None)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int, upstream: tuple[str, int], throttle: Throttle, keep_requests: bool = False,
                 assemble: Assemble | None = None, discard: Zeros | None = None) -> None:
        if discard is not None and assemble is None:
            raise BadConfig("discard: only with assemble (the proxy writes the objects it discards the bodies of)")
        super().__init__(("127.0.0.1", port), Handler)
        self.upstream, self.throttle, self.counters = upstream, throttle, Counters(keep_requests)
        self.assemble, self.zeros = assemble, discard
        self.parts: dict[str, dict[int, bytes | int]] = {}
        """With ``assemble``: by upload id, each part's body by number (with ``discard``, zeros as their size)."""
        self.parts_lock = threading.Lock()
        self.waiting: list[str] = []
        self.released: list[tuple[str, int]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stats(self) -> dict[str, Any]:
        with self.counters.lock:
            held = {"waiting": list(self.waiting), "released": [list(r) for r in self.released]}
        return {"methods": self.counters.snapshot(), "config": asdict(self.throttle.config), "held": held}

    def hold(self, path: str, body: bytes, forward: Callable[[list[bytes]], int]) -> None:
        """Keep a PUT read whole (``body``) until the config releases it, then ``forward`` it."""
        with self.counters.lock:
            self.waiting.append(path)
        self.throttle.wait_released(path)
        with self.counters.lock:
            self.waiting.remove(path)
        status = 502
        with contextlib.suppress(OSError):  # its client may be gone: the store gets the write, nobody is told
            status = forward([body])
        with self.counters.lock:
            self.released.append((path, status))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the counters say what happened

    # -- the decision, before the body when the client waits for 100 Continue ----------------------
    def handle_expect_100(self) -> bool:
        if self.path.startswith(CONTROL):
            return super().handle_expect_100()
        self._decided = self.server.throttle.decide(self.command, self.path)
        if self._decided:
            self._slow_down(body_sent=False)
            return False
        return super().handle_expect_100()

    def _serve(self) -> None:
        if self.path.startswith(CONTROL):
            self._control()
            return
        throttled = self.__dict__.pop("_decided", None)
        if throttled is None:
            throttled = self.server.throttle.decide(self.command, self.path)
        if throttled:
            self._slow_down(body_sent=True, bytes_in=self._drop_body())
            return
        if self.server.throttle.config.holds(self.command, self.path):
            self.server.hold(self.path, b"".join(self._body_pieces()), self._forward)
            return
        self._delay()
        if self.server.assemble and self._assembled():
            return
        if self.server.zeros is not None and self._answered_for_zeros(self.server.zeros):
            return
        self._forward()

    # -- multipart uploads kept by the proxy (``assemble``) ------------------------------------------
    def _assembled(self) -> bool:
        """A part kept, or an upload completed by writing its kept parts whole; False for any other request."""
        query = parse_qs(urlsplit(self.path).query)
        upload = query.get("uploadId", [""])[0]
        parts = self.server.parts
        if upload and self.command == "PUT" and "partNumber" in query:
            body = b"".join(self._body_pieces())
            zero = self.server.zeros is not None and body.count(0) == len(body)
            with self.server.parts_lock:
                parts.setdefault(upload, {})[int(query["partNumber"][0])] = len(body) if zero else body
            self._answer(200, b"", len(body), ETag=f'"{hashlib.md5(body).hexdigest()}"')
            return True
        if upload and self.command == "POST":  # the completion: the parts as kept, in their order
            self._drop_body()
            with self.server.parts_lock:
                kept = parts.get(upload, {})
                pieces = [kept[number] for number in sorted(kept)]
            body = b"".join(bytes(p) if isinstance(p, int) else p for p in pieces)
            zeros = bool(pieces) and all(isinstance(p, int) for p in pieces)
            assert self.server.assemble is not None
            path = urlsplit(self.path).path
            try:
                status, answer = self.server.assemble(path, b"" if zeros else body)
            except OSError as e:  # the store did not answer in time: the client asks again, the parts are kept
                status, answer = 500, b"<Error><Code>InternalError</Code><Message>%s</Message></Error>" % (
                    str(e).encode()[:200])
            if status == 200:
                etag = f'"{hashlib.md5(body).hexdigest()}-{len(kept)}"'
                with self.server.parts_lock:
                    parts.pop(upload, None)
                if self.server.zeros is not None:
                    if zeros:
                        self.server.zeros.keep(unquote(path), len(body), etag)
                    else:
                        self.server.zeros.forget(unquote(path))
                bucket, _, key = path.lstrip("/").partition("/")
                answer = (b"<CompleteMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key><ETag>%s</ETag>"
                          b"</CompleteMultipartUploadResult>" % (bucket.encode(), key.encode(), etag.encode()))
            self._answer(status, answer)
            return True
        if upload and self.command == "DELETE":  # an abort: the kept parts dropped, the upload's end upstream
            with self.server.parts_lock:
                parts.pop(upload, None)
        return False

    # -- objects written empty for their zeros (``discard``) ------------------------------------------
    def _answered_for_zeros(self, zeros: Zeros) -> bool:
        """A read of an object written empty answered from its size, a listing forwarded with its sizes put right,
        a write or delete of one forwarded and, once the store took it, the object forgotten (a DeleteObjects: the
        objects it names); False for any other request."""
        path = unquote(urlsplit(self.path).path)
        kept = zeros.get(path)
        if kept is not None and self.command in ("PUT", "POST", "DELETE"):
            if 200 <= self._forward() < 300:  # a create-only write refused (412) leaves the object as it was
                zeros.forget(path)
            return True
        if kept is not None and self.command in ("GET", "HEAD"):
            self._drop_body()
            self._zeros(*kept)
            return True
        if self.command == "GET" and "list-type=" in self.path:
            self._forward(rewrite=functools.partial(self._listed_sizes, zeros))
            return True
        if self.command == "POST" and "delete" in parse_qs(urlsplit(self.path).query, keep_blank_values=True):
            body = b"".join(self._body_pieces())  # DeleteObjects: the keys in its body
            bucket = path.strip("/").split("/", 1)[0]
            if self._forward(body=[body]) == 200:
                for key in re.findall(rb"<Key>(.*?)</Key>", body):
                    zeros.forget(f"/{bucket}/{html.unescape(key.decode())}")
            return True
        return False

    def _zeros(self, size: int, etag: str) -> None:
        """The object of ``size`` zeros, or the range of it the request asks for."""
        first, last, status = 0, size - 1, 200
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if ranged and ranged.group(1):
            first, last, status = int(ranged.group(1)), min(int(ranged.group(2) or size - 1), size - 1), 206
        elif ranged and ranged.group(2):
            first, status = max(size - int(ranged.group(2)), 0), 206
        length = max(last - first + 1, 0)
        sent = 0 if self.command == "HEAD" else length
        self._answered(status, 0, sent)
        self.send_response_only(status)
        self.send_header("Content-Type", "binary/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        for at in range(0, sent, _PIECE):
            self.wfile.write(bytes(min(_PIECE, sent - at)))

    def _listed_sizes(self, zeros: Zeros, listing: bytes) -> bytes:
        """A ListObjectsV2 answer with the size of every object written empty for its zeros."""
        bucket = unquote(urlsplit(self.path).path).strip("/").split("/", 1)[0]
        url_keys = b"<EncodingType>url</EncodingType>" in listing

        def contents(m: re.Match[bytes]) -> bytes:
            key = re.search(rb"<Key>(.*?)</Key>", m.group(0))
            name = html.unescape(key.group(1).decode()) if key else ""
            kept = zeros.get(f"/{bucket}/{unquote(name) if url_keys else name}")
            if kept is None:
                return m.group(0)
            return re.sub(rb"<Size>\d+</Size>", b"<Size>%d</Size>" % kept[0], m.group(0))

        return re.sub(rb"<Contents>.*?</Contents>", contents, listing, flags=re.S)

    def _answered(self, status: int, bytes_in: int, bytes_out: int = 0) -> None:
        """Count this request, answered ``status``."""
        self.server.counters.answered(self.command, self.path, status, bytes_in, bytes_out,
                                      user_agent=self.headers.get("User-Agent", ""))

    def _answer(self, status: int, body: bytes, bytes_in: int = 0, **headers: str) -> None:
        """An answer of the proxy's own, counted as the store's."""
        self._answered(status, bytes_in, len(body))
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve  # noqa: N815 (http.server's names)

    def _delay(self) -> None:
        latency = self.server.throttle.config.latency
        if latency:
            time.sleep(latency)

    def _slow_down(self, body_sent: bool, bytes_in: int = 0) -> None:
        """S3's 503 SlowDown; without the body read (``body_sent`` False) the connection cannot carry on."""
        self._delay()
        self._answered(503, bytes_in)
        body = b"" if self.command == "HEAD" else _SLOW_DOWN % (self.path.split("?", 1)[0].encode(),
                                                                b"%016X" % random.getrandbits(64))
        self.send_response_only(503, "Slow Down")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        retry_after = self.server.throttle.config.retry_after
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if not body_sent:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    # -- request bodies ---------------------------------------------------------------------------------
    def _body_pieces(self) -> Any:
        """The request body in pieces (a Content-Length body, or a chunked one's chunks)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline(1024).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                yield from self._pieces(size)
                self.rfile.readline(3)
        yield from self._pieces(int(self.headers.get("Content-Length") or 0))

    def _pieces(self, left: int) -> Iterator[bytes]:
        """The next `left` bytes of the request body, in pieces of at most _PIECE."""
        while left:
            piece = self.rfile.read(min(left, _PIECE))
            if not piece:
                raise ConnectionError("the client closed its request body early")
            left -= len(piece)
            yield piece

    def _drop_body(self) -> int:
        return sum(len(p) for p in self._body_pieces())

    # -- forwarding ---------------------------------------------------------------------------------------
    def _forward(self, body: Iterable[bytes] | None = None, rewrite: Callable[[bytes], bytes] | None = None) -> int:
        """Send the request upstream (its body read from the client, or ``body``) and relay the answer (its body
        read whole and passed through ``rewrite`` when given); its status."""
        up = http.client.HTTPConnection(*self.server.upstream, timeout=300)
        sent = received = 0
        try:
            up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() not in _HOP_BY_HOP:
                    up.putheader(k, v)
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked:
                up.putheader("Transfer-Encoding", "chunked")
            up.endheaders()
            for piece in self._body_pieces() if body is None else body:
                up.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                up.send(b"0\r\n\r\n")
            resp = up.getresponse()
        except (OSError, http.client.HTTPException) as e:
            up.close()
            self._answered(502, sent)
            self._bad_gateway(e)
            return 502
        try:
            received = self._relay(resp, rewrite)
        except OSError:  # the client is gone (a held request's may be): the store did answer
            self.close_connection = True
        finally:
            up.close()
            self._answered(resp.status, sent, received)
        return resp.status

    def _relay(self, resp: http.client.HTTPResponse, rewrite: Callable[[bytes], bytes] | None = None) -> int:
        """The upstream's answer to the client: its headers, then its body (chunked again when it had no length; read
        whole and passed through ``rewrite`` when given, a 200's)."""
        self.send_response_only(resp.status, resp.reason)
        has_body = self.command != "HEAD" and resp.status not in (204, 304) and resp.status >= 200
        whole = rewrite(resp.read()) if has_body and rewrite and resp.status == 200 else None
        rechunk = has_body and whole is None and resp.getheader("Content-Length") is None
        for k, v in resp.getheaders():
            if k.lower() not in _HOP_BY_HOP and not (whole is not None and k.lower() == "content-length"):
                self.send_header(k, v)
        if whole is not None:
            self.send_header("Content-Length", str(len(whole)))
        if rechunk:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = 0
        if whole is not None:
            self.wfile.write(whole)
            n = len(whole)
        elif has_body:
            buf = memoryview(bytearray(_PIECE))
            while size := resp.readinto(buf):
                self.wfile.write(b"%x\r\n%s\r\n" % (size, buf[:size]) if rechunk else buf[:size])
                n += size
            if rechunk:
                self.wfile.write(b"0\r\n\r\n")
        return n

    def _bad_gateway(self, e: BaseException) -> None:
        body = b"<Error><Code>BadGateway</Code><Message>%s</Message></Error>" % str(e).encode()[:200]
        self.send_response_only(502, "Bad Gateway")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    # -- control ----------------------------------------------------------------------------------------
    def _control(self) -> None:
        what = self.path[len(CONTROL):].split("?", 1)[0]
        body = b"".join(self._body_pieces())
        if self.command == "GET" and what == "stats":
            self._json(200, self.server.stats())
        elif self.command == "POST" and what == "config":
            try:
                changes = json.loads(body or b"{}")
                config = self.server.throttle.config.updated(changes, "POST /__proxy__/config")
            except (ValueError, BadConfig) as e:
                self._json(400, {"error": str(e) if isinstance(e, BadConfig) else f"not JSON: {e}"})
                return
            self.server.throttle.set(config)
            self._json(200, asdict(config))
        elif self.command == "POST" and what == "reset":
            self.server.counters.reset()
            self._json(200, {})
        else:
            self._json(404, {"error": f"no {self.command} {CONTROL}{what}: try GET stats, POST config or reset"})

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(server: Server, max_lifetime: float, stats_file: Path | None) -> None:
    """Serve until ``max_lifetime`` s have passed or SIGTERM/SIGINT; then write ``stats_file``."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="throttle-proxy", daemon=True)
    thread.start()
    stop.wait(max_lifetime)
    server.shutdown()
    server.server_close()
    if stats_file is not None:
        stats_file.write_text(json.dumps(server.stats(), indent=1))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="throttle_proxy", description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="the store, http://127.0.0.1:PORT")
    p.add_argument("--port", type=int, default=0, help="the port to listen on, 127.0.0.1 (default: a free one)")
    p.add_argument("--share", type=float, help="share of the requests answered 503 SlowDown (0..1)")
    p.add_argument("--rate", type=float, help="requests per second per key prefix (token bucket)")
    p.add_argument("--burst", type=float, help="the token bucket's size (default 10)")
    p.add_argument("--methods", help="only these methods are throttled, comma-separated (default: all)")
    p.add_argument("--paths", help="only paths matching this regular expression are throttled")
    p.add_argument("--retry-after", type=int, help="Retry-After seconds of a 503 (default 1; -1: no header)")
    p.add_argument("--latency", type=float, help="seconds added before each answer")
    p.add_argument("--config", default="{}", help="a JSON object of the same keys (applied after the flags)")
    p.add_argument("--seed", type=int, help="seed of the throttling draws")
    p.add_argument("--max-lifetime", type=float, default=3600.0, help="exit after this many seconds (3600)")
    p.add_argument("--stats-file", type=Path, help="write the counters here (JSON) at exit")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    """The flags, then --config, over the defaults; BadConfig naming the flag."""
    flags: dict[str, Any] = {k: getattr(args, k) for k in ("share", "rate", "burst", "paths", "latency")
                             if getattr(args, k) is not None}
    if args.methods is not None:
        flags["methods"] = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.retry_after is not None:
        flags["retry_after"] = None if args.retry_after == -1 else args.retry_after
    config = Config().updated(flags, "flags")
    try:
        changes = json.loads(args.config)
    except ValueError as e:
        raise BadConfig(f"--config: not JSON: {e}") from None
    return config.updated(changes, "--config")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        upstream = parse_upstream(args.upstream)
        config = config_from_args(args)
    except BadConfig as e:
        print(f"throttle_proxy: {e}", file=sys.stderr)
        return 2
    server = Server(args.port, upstream, Throttle(config, args.seed))
    print(f"listening {server.endpoint} -> {args.upstream}", flush=True)
    serve(server, args.max_lifetime, args.stats_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
