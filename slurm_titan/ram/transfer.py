"""Snapshots between nodes: each node supervisor serves its memory folder over HTTP on a port of its own.

``PUT /step-N/rank-R/<file>`` (the partner's push, every file then ``snapshot.json`` last; received at
:data:`slurm_titan.thread_priority.BACKGROUND_NICE`) lands in a hidden staging folder and is sealed into
``step-N/rank-R`` once the manifest's sizes match; ``GET`` of the same paths serves a snapshot to a recovering node
(at training's priority). Every file carries its XXH3-64 digest (``X-Xxh3-64``), checked by the receiver: a push
takes 0.86x the CPU it took with zlib's CRC-32 (``tools/bench/ram_push.py``).
Requests must carry the node's token (``Authorization: Bearer``), published only in the job's folder: no one
outside the job reads or writes a node's snapshots.
"""

from __future__ import annotations

import http.client
import re
import secrets
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from slurm_titan.ram import layout, snapshot
from slurm_titan.thread_priority import BACKGROUND_NICE, lower_thread_priority

CHUNK = 1 << 20
TIMEOUT_S = 60.0
SHUTDOWN_POLL_S = 0.05
"""How often the server looks for :meth:`SnapshotServer.close`'s word: close() waits up to this long (the standard
library's 0.5 s, on the path from a fault to the next step: the supervisor closes it before it exits)."""
_PATH = re.compile(r"^/step-(\d+)/rank-(\d+)/(\.?[A-Za-z0-9_][A-Za-z0-9_.-]*)$")


class TransferError(Exception):
    """A snapshot could not be moved between nodes, in one line."""


DIGEST = "X-Xxh3-64"


def new_digest() -> Any:
    """A running digest of what a file of a snapshot carries (``update``, ``hexdigest``): XXH3-64."""
    return xxhash.xxh3_64()


def digest_of(data: bytes) -> str:
    digest = new_digest()
    digest.update(data)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = new_digest()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _staging(root: Path, step: int, rank: int) -> Path:
    return layout.step_dir(root, step) / f".rank-{rank}.received"


class SnapshotServer:
    """Serves ``root`` (a node's memory folder) to the job's other nodes; ``port`` 0 picks a free one."""

    def __init__(self, root: Path, run: str, world_size: int, port: int = 0) -> None:
        self.root, self.run, self.world_size = root, run, world_size
        self.token = secrets.token_hex(16)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server._get(self)

            def do_PUT(self) -> None:  # noqa: N802
                server._put(self)

        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S},
                                       name="ram-snapshot-server", daemon=True)

    def start(self) -> SnapshotServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _parse(self, request: BaseHTTPRequestHandler) -> tuple[int, int, str] | None:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            request.send_error(403, "not this job's token")
            return None
        m = _PATH.match(request.path)
        if not m:
            request.send_error(404, "not a snapshot path")
            return None
        return int(m.group(1)), int(m.group(2)), m.group(3)

    def _get(self, request: BaseHTTPRequestHandler) -> None:
        parsed = self._parse(request)
        if parsed is None:
            return
        step, rank, name = parsed
        path = layout.rank_dir(self.root, step, rank) / name
        try:
            size, digest = path.stat().st_size, file_digest(path)
            f = open(path, "rb")  # noqa: SIM115 - closed below, after the headers are out
        except FileNotFoundError:
            request.send_error(404, f"no {name} of step {step} rank {rank} here")
            return
        with f:
            request.send_response(200)
            request.send_header("Content-Length", str(size))
            request.send_header(DIGEST, digest)
            request.end_headers()
            shutil.copyfileobj(f, request.wfile, CHUNK)

    def _put(self, request: BaseHTTPRequestHandler) -> None:
        parsed = self._parse(request)
        if parsed is None:
            return
        step, rank, name = parsed
        lower_thread_priority(BACKGROUND_NICE)  # this request's thread: the partner's copy, training's leftovers
        staging = _staging(self.root, step, rank)
        if name != layout.MANIFEST:
            staging.mkdir(parents=True, exist_ok=True)
        try:
            length, sent = int(request.headers["Content-Length"]), request.headers[DIGEST]
            data = request.rfile.read(length) if name == layout.MANIFEST else None
            got = new_digest()
            if data is None:
                with open(staging / name, "wb") as out:
                    left = length
                    while left:
                        chunk = request.rfile.read(min(CHUNK, left))
                        if not chunk:
                            raise ValueError(f"{name}: the body ended after {length - left} of {length} bytes")
                        got.update(chunk)
                        out.write(chunk)
                        left -= len(chunk)
            else:
                got.update(data)
            if got.hexdigest() != sent:
                raise ValueError(f"{name}: XXH3-64 {got.hexdigest()}, the sender's {sent}")
            if data is not None:
                self._seal(staging, data, step, rank)
        except (KeyError, ValueError, OSError) as error:
            request.send_error(400, str(error))
            return
        request.send_response(204)
        request.end_headers()

    def _seal(self, staging: Path, data: bytes, step: int, rank: int) -> None:
        manifest = snapshot.Manifest.from_json(data, f"step {step} rank {rank}'s manifest")
        if why := manifest.mismatch(run=self.run, step=step, rank=rank, world_size=self.world_size):
            raise ValueError(why)
        for name, size in manifest.files.items():
            if not (staging / name).is_file() or (staging / name).stat().st_size != size:
                raise ValueError(f"{name}: not received whole")
        snapshot.seal(staging, manifest, layout.rank_dir(self.root, step, rank))


def _request(host: str, port: int, token: str, method: str, path: str, body: BinaryIO | bytes | None = None,
             headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S, blocksize=CHUNK)
    connection.request(method, path, body=body, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    return connection.getresponse()


def push(folder: Path, host: str, port: int, token: str) -> int:
    """Send the complete snapshot in ``folder`` (``step-N/rank-R``) to the node at ``host:port``, manifest last;
    returns the bytes sent. TransferError when the receiver refuses it or cannot be reached."""
    manifest = snapshot.read_manifest(folder)
    base = f"/step-{manifest.step}/rank-{manifest.rank}/"
    sent = 0
    try:
        for name, size in sorted(manifest.files.items()):
            path = folder / name
            with open(path, "rb") as f:
                response = _request(host, port, token, "PUT", base + name, f,
                                    {"Content-Length": str(size), DIGEST: file_digest(path)})
            _expect(response, 204, f"{host}:{port} {base + name}")
            sent += size
        data = manifest.to_json().encode()
        response = _request(host, port, token, "PUT", base + layout.MANIFEST, data,
                            {"Content-Length": str(len(data)), DIGEST: digest_of(data)})
        _expect(response, 204, f"{host}:{port} {base + layout.MANIFEST}")
    except OSError as error:
        raise TransferError(f"{host}:{port}: {error}") from None
    return sent


def pull(host: str, port: int, token: str, root: Path, *, run: str, step: int, rank: int, world_size: int) -> int:
    """Fetch rank ``rank``'s snapshot of ``step`` from the node at ``host:port`` into ``root`` (sealed in place once
    every file's size and digest match); returns the bytes fetched. TransferError (one line) when that node does
    not have it, answers with a snapshot of another run or step, or a file arrives damaged."""
    base = f"/step-{step}/rank-{rank}/"
    staging = _staging(root, step, rank)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        response = _request(host, port, token, "GET", base + layout.MANIFEST)
        _expect(response, 200, f"{host}:{port} {base + layout.MANIFEST}")
        manifest = snapshot.Manifest.from_json(response.read(), f"{host}:{port} {base + layout.MANIFEST}")
        if why := manifest.mismatch(run=run, step=step, rank=rank, world_size=world_size):
            raise TransferError(f"{host}:{port} answered for step {step} rank {rank} with {why}")
        for name, size in sorted(manifest.files.items()):
            response = _request(host, port, token, "GET", base + name)
            _expect(response, 200, f"{host}:{port} {base + name}")
            sent, got = response.headers[DIGEST], new_digest()
            with open(staging / name, "wb") as out:
                while chunk := response.read(CHUNK):
                    got.update(chunk)
                    out.write(chunk)
            if (arrived := (staging / name).stat().st_size) != size or got.hexdigest() != sent:
                raise TransferError(f"{host}:{port} {base + name}: arrived damaged "
                                    f"({arrived} of {size} bytes, XXH3-64 {got.hexdigest()} vs {sent})")
        snapshot.seal(staging, manifest, layout.rank_dir(root, step, rank))
    except (OSError, KeyError, ValueError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise TransferError(f"{host}:{port} step {step} rank {rank}: {error}") from None
    except TransferError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest.size


def _expect(response: http.client.HTTPResponse, status: int, what: str) -> None:
    if response.status != status:  # the server's one-line reason is in the status line
        response.read()
        raise TransferError(f"{what}: HTTP {response.status} {response.reason}")
    if status == 204:
        response.read()
