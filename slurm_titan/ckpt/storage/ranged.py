"""A local file filled by ranges that land in any order: written past the page cache, hashed in order.

Restoring from S3, each large file is fetched as parallel ranges (:mod:`.s3_http`). Measured on
the 2-core test machine (4 GiB in 64 shards from SeaweedFS on loopback), most of the client's CPU
went into copying the received bytes into the page cache (perf: ``copy_folio_from_iter_atomic``
26% of the samples, the socket receive 8%, xxh3 0.7%), and reading them back to hash them.
Here each range is received into a page-aligned buffer, written with ``O_DIRECT`` (no copy;
the disk took 1.7 GB/s direct, 0.73 GB/s buffered), and hashed from that buffer once the ranges
before it are hashed. A range that lands early waits in memory within a byte budget shared by
the download, else is read back from the file when its turn comes. File systems that refuse
``O_DIRECT`` (tmpfs, some network file systems) get ordinary writes, as does every file with
``SLURM_TITAN_CKPT_DIRECT_IO=0`` (:class:`.base.TransferConfig`).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading

from slurm_titan.ckpt.checksum import Hasher, new_hasher

ALIGN = 4096
"""O_DIRECT offsets, lengths and buffer addresses are multiples of this (the page size covers
every logical block size in use)."""


class Budget:
    """Bytes of early ranges that may wait in memory at once (for all files of a download)."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.left += n


class PartBuffers:
    """Page-aligned buffers of ``size`` bytes (anonymous mappings), reused within a download."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free: list[mmap.mmap] = []
        self.made: list[mmap.mmap] = []
        self.lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self.lock:
            if self.free:
                return self.free.pop()
            buf = mmap.mmap(-1, self.size)
            self.made.append(buf)
            return buf

    def give(self, bufs: list[mmap.mmap]) -> None:
        with self.lock:
            self.free += bufs

    def close(self) -> None:
        for buf in self.made:
            with contextlib.suppress(BufferError):  # a view still held by a failed request
                buf.close()
        self.made.clear()
        self.free.clear()


class Writer:
    """Writes to ``path`` (already open as ``fd``): the page-aligned part of each piece with
    O_DIRECT (no copy into the page cache, nothing left to sync), the rest through ``fd``."""

    def __init__(self, fd: int, path: str, direct: bool = True) -> None:
        self.fd = fd
        self.path = path
        self.direct_fd = _open_direct(path) if direct else -1
        self.direct_ok = self.direct_fd >= 0

    def write(self, off: int, data: memoryview) -> None:
        """Write ``data`` (from a page-aligned buffer) at ``off``: its aligned part directly, the
        rest (the file's tail) through the page cache."""
        direct = len(data) - len(data) % ALIGN if self.direct_ok and off % ALIGN == 0 else 0
        if direct:
            try:
                _write_all(self.direct_fd, data[:direct], off)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: the file system wants another alignment
                    raise
                self.direct_ok = False
                direct = 0
        _write_all(self.fd, data[direct:], off + direct)

    def close(self) -> None:
        """Close the direct descriptor (``fd`` is the caller's)."""
        if self.direct_fd >= 0:
            os.close(self.direct_fd)
            self.direct_fd = -1


class RangedFile(Writer):
    """``path`` (already open as ``fd``, read-write, sized) filled range by range: ``write`` puts
    a range on disk, ``landed`` hashes what is now contiguous, ``checksum`` is the whole file's."""

    def __init__(self, fd: int, path: str, algorithm: str, budget: Budget, direct: bool = True) -> None:
        super().__init__(fd, path, direct)
        self.hasher: Hasher = new_hasher(algorithm)
        self.budget = budget
        self.hashed = 0
        self.early: dict[int, tuple[int, mmap.mmap | None]] = {}
        self.lock = threading.Lock()

    def landed(self, off: int, n: int, buf: mmap.mmap) -> list[mmap.mmap]:
        """Range [off, off+n) is on disk, its bytes in ``buf``: hash it and every early range it
        makes contiguous. Returns the buffers no longer needed."""
        done: list[mmap.mmap] = []
        with self.lock:
            if off != self.hashed:
                keep = self.budget.take(n)
                self.early[off] = (n, buf if keep else None)
                return [] if keep else [buf]
            self.hasher.update(memoryview(buf)[:n])
            done.append(buf)
            self.hashed += n
            while self.hashed in self.early:
                n, kept = self.early.pop(self.hashed)
                if kept is None:
                    self.hasher.update(os.pread(self.fd, n, self.hashed))
                else:
                    self.hasher.update(memoryview(kept)[:n])
                    self.budget.give(n)
                    done.append(kept)
                self.hashed += n
        return done

    def checksum(self) -> tuple[int, str]:
        """(bytes hashed, hex digest): call once every range has landed."""
        return self.hashed, self.hasher.hexdigest()

    def close(self) -> None:
        """Close the direct descriptor (``fd`` is the caller's) and free the early ranges' budget."""
        super().close()
        for n, kept in self.early.values():
            if kept is not None:
                self.budget.give(n)
        self.early.clear()


def _open_direct(path: str) -> int:
    """A write-only O_DIRECT descriptor of ``path``, or -1 where the file system refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return -1


def _write_all(fd: int, data: memoryview, off: int) -> None:
    while data:
        k = os.pwrite(fd, data, off)
        data, off = data[k:], off + k
