"""A shared file system without client caching, on one machine: a FUSE passthrough over a backing folder that
counts every operation and delays each metadata operation (20 ms by default), so that what the project's code does
to a job folder on a busy shared file system is counted and felt (tools/bench/scale_sim/folder.py).

    .venv/bin/python -m tools.local_fs.slow_fs BACKING MOUNTPOINT... --delay 0.02 --stats FILE  # until unmounted
    kill -USR1 PID                  # writes the stats now
    fusermount3 -u MOUNTPOINT       # each of them; once all are unmounted, the stats are written once more

    with SlowFs(backing, [mountpoint], delay_s=0.02) as fs:  # mounts in a child process, waits until it is live
        before = fs.stats()                                   # a snapshot (SIGUSR1); fs.final once unmounted

Each mount point is a client (a node: the kernel serializes the changes to a folder per mount, as each node's own
kernel does), all served by one server process: one set of counters and delays. libfuse3's multithreaded loop
(through mfusepy; up to ``--threads`` requests at once per mount) serves requests in parallel: each delay holds one
thread only, so concurrent clients overlap as on a real server. The kernel's entry, attribute and negative caches
are off (timeouts 0): every path walk looks each name up again, every stat reaches the server; ``--cache S`` keeps
names and attributes S seconds (as an NFS client's caches do; missing names are never cached).

Metadata operations, each delayed: getattr (libfuse's path API serves the kernel's lookups and getattrs alike; it
also follows a create, mkdir or setattr with one), access, opendir, readdir, releasedir, open, create, release,
mkdir, rmdir, rename, unlink, utimens, chmod, chown, truncate, statfs. Data operations, counted and not delayed:
read, write, flush, fsync.

The stats file, JSON, replaced whole: ``started`` and ``time`` (Unix times), ``delay_s``, ``metadata`` and ``data``
(operations by kind), ``bytes`` (read, write), ``per_second`` (metadata operations in each Unix second) and
``touches`` (each path's utimens times, whatever the mount: the heartbeats). Needs Debian's fuse3 (tools/setup)
and /dev/fuse.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import mfusepy  # type: ignore[import-untyped]

DELAY_S = 0.020
THREADS = 256
MOUNT_S = 15.0
"""How long the child may take to mount, to write a snapshot, or to exit once unmounted."""
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2  # utimensat(2)'s tv_nsec values, as libfuse passes them on
REPO = Path(__file__).resolve().parents[2]
STAT_KEYS = ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize",
             "st_atime", "st_mtime", "st_ctime")
STATVFS_KEYS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                "f_flag", "f_namemax")


class Counts:
    """What the file system served, for the stats file."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.started = delay_s, time.time()
        self.lock = threading.Lock()
        self.metadata: Counter[str] = Counter()
        self.data: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()
        self.touches: defaultdict[str, list[float]] = defaultdict(list)

    def metadata_op(self, kind: str) -> None:
        """Count one metadata operation, then wait as a busy metadata server makes it wait."""
        with self.lock:
            self.metadata[kind] += 1
            self.per_second[int(time.time())] += 1
        time.sleep(self.delay_s)

    def data_op(self, kind: str, nbytes: int = 0) -> None:
        with self.lock:
            self.data[kind] += 1
            if nbytes:
                self.bytes[kind] += nbytes

    def touch(self, path: str) -> None:
        with self.lock:
            self.touches[path].append(time.time())

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"started": self.started, "time": time.time(), "delay_s": self.delay_s,
                    "metadata": dict(self.metadata), "data": dict(self.data), "bytes": dict(self.bytes),
                    "per_second": {str(second): n for second, n in sorted(self.per_second.items())},
                    "touches": {path: list(times) for path, times in self.touches.items()}}

    def write(self, path: Path) -> None:
        """The stats file, replaced whole (a reader sees the old or the new)."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.snapshot()), encoding="utf-8")
        os.replace(tmp, path)


Method = TypeVar("Method", bound=Callable[..., Any])


def metadata(method: Method) -> Method:
    """A metadata operation: counted under the method's name and delayed before it is served."""

    @functools.wraps(method)  # keeps the signature, which mfusepy inspects (create)
    def counted(self: SlowPassthrough, *args: Any) -> Any:
        self.counts.metadata_op(method.__name__)
        return method(self, *args)

    return counted  # type: ignore[return-value]


class SlowPassthrough(mfusepy.Operations):  # type: ignore[misc]
    """The operations on the mount, served from ``backing`` (paths are relative to the mount's root)."""

    use_ns = True

    def __init__(self, backing: Path, counts: Counts, cache_s: float = 0.0) -> None:
        self.root, self.counts, self.cache_s = str(backing), counts, cache_s

    def _full(self, path: str) -> str:
        return self.root + path

    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        config_3.entry_timeout = config_3.attr_timeout = self.cache_s
        config_3.negative_timeout = 0.0  # a name that was missing is looked up again (NFS's lookupcache=positive)

    @metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        st = os.lstat(self._full(path)) if fh is None else os.fstat(fh)
        return {key: getattr(st, key + "_ns" if key.endswith("time") else key) for key in STAT_KEYS}

    @metadata
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise PermissionError(13, "access denied", path)
        return 0

    @metadata
    def opendir(self, path: str) -> int:
        return 0

    @metadata
    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    @metadata
    def releasedir(self, path: str, fh: int) -> int:
        return 0

    @metadata
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        return 0

    @metadata
    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        return 0

    @metadata
    def unlink(self, path: str) -> int:
        os.unlink(self._full(path))
        return 0

    @metadata
    def rename(self, old: str, new: str) -> int:
        os.rename(self._full(old), self._full(new))
        return 0

    @metadata
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    @metadata
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    @metadata
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        os.truncate(self._full(path) if fh is None else fh, length)
        return 0

    @metadata
    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._full(path))
        return {key: getattr(st, key) for key in STATVFS_KEYS}

    @metadata
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self.counts.touch(path)
        full = self._full(path)
        if times is None:
            os.utime(full)
            return 0
        st, now = os.lstat(full), time.time_ns()
        os.utime(full, ns=tuple(now if ns == UTIME_NOW else old if ns == UTIME_OMIT else ns  # type: ignore[arg-type]
                                for ns, old in zip(times, (st.st_atime_ns, st.st_mtime_ns))))
        return 0

    @metadata
    def open(self, path: str, flags: int) -> int:
        return os.open(self._full(path), flags)

    @metadata
    def create(self, path: str, mode: int, flags: int) -> int:
        return os.open(self._full(path), flags | os.O_CREAT, mode)

    @metadata
    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        data = os.pread(fh, size, offset)
        self.counts.data_op("read", len(data))
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.counts.data_op("write", len(data))
        return os.pwrite(fh, data, offset)

    def flush(self, path: str, fh: int) -> int:
        self.counts.data_op("flush")
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.counts.data_op("fsync")
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0


def _write_on_request(counts: Counts, stats: Path) -> None:
    """Write the stats at each SIGUSR1 (blocked in every thread, taken here)."""
    while True:
        signal.sigwait({signal.SIGUSR1})
        counts.write(stats)


def _mount(operations: SlowPassthrough, mountpoint: Path, threads: int) -> None:
    mfusepy.FUSE(operations, str(mountpoint), foreground=True, fsname="slow_fs", max_threads=threads)


def serve(backing: Path, mountpoints: list[Path], delay_s: float, stats: Path, threads: int = THREADS,
          cache_s: float = 0.0) -> None:
    """Mount ``backing`` at each of ``mountpoints`` (a libfuse session each, one server's counters and delays),
    serve until every one is unmounted, then write the stats."""
    counts = Counts(delay_s)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # before libfuse starts its threads
    threading.Thread(target=_write_on_request, args=(counts, stats), name="stats", daemon=True).start()
    sessions = [threading.Thread(target=_mount, args=(SlowPassthrough(backing, counts, cache_s), mountpoint, threads),
                                 name=f"fuse {mountpoint}") for mountpoint in mountpoints]
    try:
        for session in sessions:
            session.start()
        for session in sessions:
            session.join()
    finally:
        counts.write(stats)


def mount_points() -> set[str]:
    """The mount points of this machine, from the mount table (not a stat of each)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return {line.split()[4] for line in table}


class SlowFs:
    """The slow file system over ``backing``, mounted at each of ``mountpoints`` (a client each) by a child process
    for a ``with`` block. The stats go to ``stats`` (default: beside the first mount point), the child's log beside
    them."""

    def __init__(self, backing: Path, mountpoints: list[Path], delay_s: float = DELAY_S, stats: Path | None = None,
                 threads: int = THREADS, cache_s: float = 0.0) -> None:
        self.backing = backing.resolve()
        self.mountpoints = [mountpoint.resolve() for mountpoint in mountpoints]
        first = self.mountpoints[0]
        self.stats_file = (stats or first.with_name(f"{first.name}.stats.json")).resolve()
        self.log = self.stats_file.with_suffix(".log")
        self.argv = [sys.executable, "-m", "tools.local_fs.slow_fs", str(self.backing),
                     *map(str, self.mountpoints), "--delay", str(delay_s), "--stats", str(self.stats_file),
                     "--threads", str(threads), "--cache", str(cache_s)]
        self.child: subprocess.Popen[bytes] | None = None
        self.final: dict[str, Any] | None = None

    def _mounted(self) -> list[Path]:
        points = mount_points()
        return [mountpoint for mountpoint in self.mountpoints if str(mountpoint) in points]

    def __enter__(self) -> SlowFs:
        for folder in (self.backing, *self.mountpoints):
            folder.mkdir(parents=True, exist_ok=True)
        self.stats_file.unlink(missing_ok=True)
        with open(self.log, "wb") as log:
            self.child = subprocess.Popen(self.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + MOUNT_S
        while len(self._mounted()) < len(self.mountpoints):
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"slow_fs did not mount {self.mountpoints}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """The counters now (the child writes them on SIGUSR1)."""
        assert self.child is not None
        self.stats_file.unlink(missing_ok=True)
        self.child.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + MOUNT_S
        while not self.stats_file.exists():
            if self.child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slow_fs wrote no stats: {self.log.read_text()[-2000:]}")
            time.sleep(0.01)
        return json.loads(self.stats_file.read_text(encoding="utf-8"))

    def close(self) -> None:
        """Unmount (lazily when busy), wait for the child (killed if it must be), keep its last stats in ``final``."""
        for mountpoint in self._mounted():
            if self._fusermount("-u", mountpoint):
                self._fusermount("-u", "-z", mountpoint)
        if self.child is not None:
            try:
                self.child.wait(MOUNT_S)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        for mountpoint in self._mounted():  # a killed server leaves its mounts behind, cut off
            self._fusermount("-u", "-z", mountpoint)
        if self.stats_file.exists():
            self.final = json.loads(self.stats_file.read_text(encoding="utf-8"))

    @staticmethod
    def _fusermount(*args: str | Path) -> int:
        return subprocess.run(["fusermount3", *map(str, args)], capture_output=True).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path, help="the folder whose files the mount shows")
    parser.add_argument("mountpoints", type=Path, nargs="+", metavar="MOUNTPOINT", help="a mount (client) each")
    parser.add_argument("--delay", type=float, default=DELAY_S, help="seconds each metadata operation waits")
    parser.add_argument("--stats", type=Path, required=True, help="the JSON stats file (SIGUSR1, unmount)")
    parser.add_argument("--threads", type=int, default=THREADS, help="requests served at once, at most")
    parser.add_argument("--cache", type=float, default=0.0,
                        help="seconds a client keeps a name's lookup and attributes (default 0: caches off)")
    args = parser.parse_args(argv)
    serve(args.backing.resolve(), args.mountpoints, args.delay, args.stats, args.threads, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
