"""A checkpoint location in a local (or network-mounted) folder.

Small objects are written to a temporary name, fsynced and renamed (``create_bytes`` hard-links
instead, so that an existing name is never replaced). Files are copied through a reusable buffer,
hashed on the way, to a temporary name, fsynced and renamed, several at once; restores write with
O_DIRECT (:class:`.ranged.Writer`): the copy is on disk when it returns, with no dirty pages for
a later sync to flush.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator

from slurm_titan.ckpt.checksum import BlockHasher, Hasher, Readable, new_hasher
from slurm_titan.ckpt.manifest import FileEntry
from slurm_titan.ckpt.storage import ranged
from slurm_titan.ckpt.storage.backoff import Backoff
from slurm_titan.ckpt.storage.base import Entry, Progress, RangeReader, Spans, Store, TransferConfig, Uploaded
from slurm_titan.ckpt.storage.errors import LocalFileError, open_local
from slurm_titan.errors import StorageError

_LOCAL_BUF = 256 << 10  # small: stays in cache while read, hashed and written (8 MiB x 4 threads was 3x slower)
_DIRECT_BUF = 1 << 20
"""Restores from a directory write with O_DIRECT from a buffer this large: 1 GiB in 16 files
took 0.30-0.35 s (nothing left to sync), against 0.35-0.67 s for the buffered copy and 0.45-0.53 s
for ``cp -r`` + ``sync`` (the buffered copy plus its sync swung with the page cache's state)."""


class LocalStore(Store):
    """A folder; ``location`` is how it was named (a path or ``file://`` URL)."""

    def __init__(self, root: str, location: str, transfer: TransferConfig | None = None,
                 retry: Backoff | None = None, notice: Callable[[str], None] | None = None) -> None:
        super().__init__(root, location, transfer=transfer, retry=retry, notice=notice)

    def _describe(self, e: BaseException) -> str:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        return super()._describe(e)

    def _check(self, create: bool) -> None:
        if not os.path.isdir(self.root):
            if create:
                try:
                    os.makedirs(self.root, exist_ok=True)
                except OSError as e:
                    raise self._fail(f"cannot create the folder: {e.strerror}") from None
            elif os.path.exists(self.root):
                raise self._fail("not a folder")
            else:
                raise self._fail("no such folder")
        if create and not os.access(self.root, os.W_OK):
            raise self._fail("the folder is not writable")

    def _ls(self, rel: str) -> Iterator[Entry]:
        try:
            with os.scandir(self.full(rel)) as it:
                for de in it:
                    try:
                        st = de.stat()
                    except FileNotFoundError:
                        continue
                    is_dir = de.is_dir()
                    yield Entry(self.rel(de.path), 0 if is_dir else st.st_size, st.st_mtime, is_dir)
        except (FileNotFoundError, NotADirectoryError):
            return

    def _find(self, rel: str) -> Iterator[Entry]:
        for dirpath, _dirs, files in os.walk(self.full(rel)):
            for name in files:
                p = os.path.join(dirpath, name)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                yield Entry(self.rel(p), st.st_size, st.st_mtime)

    def _cat(self, rel: str) -> bytes:
        try:
            with open(self.full(rel), "rb") as f:
                return f.read()
        except NotADirectoryError:
            raise FileNotFoundError(rel) from None

    def _exists(self, rel: str) -> bool:
        return os.path.exists(self.full(rel))

    def _put(self, rel: str, data: bytes) -> None:
        path = self.full(rel)
        with _written(os.path.dirname(path), data) as tmp:
            os.replace(tmp, path)

    def _create(self, rel: str, data: bytes) -> bool:
        """Written to a temporary file, fsynced, then hard-linked into place (link fails if the
        name exists, so there is no window where a partial file is visible or replaced)."""
        path = self.full(rel)
        d = os.path.dirname(path)
        with _written(d, data) as tmp:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if os.path.exists(path):  # filesystem without hard links
                    return False
                os.rename(tmp, path)
        _fsync_dir(d)
        return True

    def _rm_files(self, rels: list[str]) -> None:
        for r in rels:
            try:
                os.unlink(self.full(r))
            except FileNotFoundError:
                pass
            except OSError as e:
                raise self._fail(f"cannot delete {r}: {e.strerror}") from None

    def _rm_tree(self, rel: str) -> None:
        path = self.full(rel)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):
            raise self._fail(f"cannot delete {rel}")

    # -- big files ------------------------------------------------------------------------
    def _upload_many(self, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                     spans: Spans, uploaded: Uploaded) -> list[FileEntry]:
        def one(item: tuple[str, str]) -> FileEntry:
            lp, r = item
            h = BlockHasher(algorithm, self.transfer.block_size, spans.get(r, ()))
            entry = FileEntry.hashed(r, _copy_hash(lp, self.full(r), h, progress), h)
            uploaded(entry)
            return entry

        return self._each(one, items)

    def _download_many(self, items: list[tuple[str, str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str]]:
        def one(item: tuple[str, str, int | None]) -> tuple[int, str]:
            r, lp, _ = item
            src = self.full(r)
            if not os.path.exists(src):
                raise StorageError(f"{self.url(r)}: no such file")
            h = new_hasher(algorithm)
            size = _copy_hash(src, lp, h, progress, atomic=False, sync=False, direct=self.transfer.direct_io)
            return size, h.hexdigest()

        return self._each(one, items)

    def _open_read(self, rel: str) -> contextlib.AbstractContextManager[Readable]:
        return open(self.full(rel), "rb", buffering=0)  # noqa: SIM115 - the caller's with closes it

    def _range_reader(self) -> RangeReader:
        return _PreadReader(self)


class _PreadReader:
    """Byte ranges of the folder's files with pread, one descriptor per file."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def read(self, rel: str, off: int, view: memoryview, progress: Progress) -> int:
        with self.lock:
            fd = self.fds.get(rel)
            if fd is None:
                try:
                    fd = self.fds[rel] = os.open(self.store.full(rel), os.O_RDONLY)
                except OSError as e:
                    raise StorageError(f"{self.store.url(rel)}: cannot read: {e.strerror}") from None
        got = 0
        while got < len(view):
            k = os.preadv(fd, [view[got:]], off + got)
            if not k:
                break
            got += k
        progress(got)
        return got

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


@contextlib.contextmanager
def _written(d: str, data: bytes) -> Iterator[str]:
    """A temporary file in ``d`` holding ``data``, fsynced; removed after the block unless the
    block renamed it."""
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _fsync_dir(d: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _copy_hash(src: str, dst: str, h: Hasher, progress: Progress, atomic: bool = True,
               sync: bool = True, direct: bool = False) -> int:
    """Copy src to dst hashing the bytes with ``h``; returns the size; dst appears only when
    complete (tmp + rename).

    ``direct``: write past the page cache (O_DIRECT, where the file system allows it), from a
    page-aligned buffer, so that the copy is on disk when it returns and costs no later sync."""
    fin = open_local(src)
    d = os.path.dirname(dst) or "."
    size = 0
    with fin:
        try:
            os.makedirs(d, exist_ok=True)
            if atomic:
                fd, tmp = tempfile.mkstemp(dir=d, prefix=".part-" + os.path.basename(dst)[:40] + ".")
            else:
                tmp = dst
                fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise StorageError(f"cannot write {dst}: {e.strerror}") from None
        out = ranged.Writer(fd, tmp, direct)
        buf = mmap.mmap(-1, _DIRECT_BUF) if out.direct_ok else bytearray(_LOCAL_BUF)
        view = memoryview(buf)
        try:
            while True:
                try:
                    n = fin.readinto(view)
                except OSError as e:
                    raise LocalFileError(f"cannot read {src}: {e.strerror}") from None
                if not n:
                    break
                h.update(view[:n])
                out.write(size, view[:n])
                size += n
                progress(n)
            if sync:
                os.fsync(fd)
            out.close()
            os.close(fd)
            fd = -1
            if atomic:
                os.replace(tmp, dst)
        except OSError as e:
            raise StorageError(f"cannot write {dst}: {e.strerror}") from None
        finally:
            out.close()
            view.release()
            if isinstance(buf, mmap.mmap):
                buf.close()
            if fd >= 0:
                os.close(fd)
            if atomic:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    return size
