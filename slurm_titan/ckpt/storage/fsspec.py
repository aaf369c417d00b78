"""A checkpoint location on any fsspec filesystem (``memory://``, ``gs://``, ``hdfs://`` ...).

The generic backend, and the base of :class:`.s3.S3Store`: small objects through ``cat_file`` /
``pipe_file`` (``mode="create"`` for the exclusive create), listings through ``ls`` / ``find``,
whole files streamed through ``fs.open`` (of :attr:`FsspecStore.stream_fs`) in 8 MiB chunks, byte ranges
through ``cat_file``. A file that the store throttles is moved again whole, under the store's retry policy (the
filesystem retries other failures itself, and what it sends inside a file: s3fs a multipart part).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from slurm_titan.ckpt.checksum import BlockHasher, Readable, new_hasher
from slurm_titan.ckpt.manifest import FileEntry
from slurm_titan.ckpt.storage.backoff import Backoff
from slurm_titan.ckpt.storage.base import Entry, Progress, RangeReader, Spans, Store, TransferConfig, Uploaded
from slurm_titan.ckpt.storage.errors import open_local

_CHUNK = 8 << 20


class FsspecStore(Store):
    """``fs`` (an fsspec filesystem) below ``root`` (the filesystem's name of the location)."""

    library_retries = True

    def __init__(self, fs: Any, root: str, location: str, *, endpoint: str | None = None,
                 transfer: TransferConfig | None = None, secrets: tuple[str, ...] = (),
                 retry: Backoff | None = None, notice: Callable[[str], None] | None = None) -> None:
        super().__init__(root, location, endpoint=endpoint, transfer=transfer, secrets=secrets, retry=retry,
                         notice=notice)
        self.fs = fs

    @property
    def stream_fs(self) -> Any:
        """The filesystem whole files are streamed through (``fs.open``): :attr:`fs`."""
        return self.fs

    def _check(self, create: bool) -> None:
        self.fs.exists(self.root)

    def _ls(self, rel: str) -> Iterator[Entry]:
        path = self.full(rel)
        try:
            infos = self.fs.ls(path, detail=True)
        except FileNotFoundError as e:
            if self._missing_bucket(e):
                raise
            return
        for info in infos:
            name = info["name"].rstrip("/")
            if name != path.rstrip("/"):
                is_dir = info.get("type") == "directory"
                yield Entry(self.rel(name), int(info.get("size") or 0), _mtime(info), is_dir)

    def _find(self, rel: str) -> Iterator[Entry]:
        try:
            infos = self.fs.find(self.full(rel), detail=True, withdirs=False)
        except FileNotFoundError as e:
            if self._missing_bucket(e):
                raise
            return
        for name, info in infos.items():
            if info.get("type") != "directory":
                yield Entry(self.rel(name), int(info.get("size") or 0), _mtime(info))

    def _cat(self, rel: str) -> bytes:
        return self.fs.cat_file(self.full(rel))

    def _cat_many(self, rels: list[str]) -> dict[str, bytes | None | Exception]:
        raw = self.fs.cat([self.full(r) for r in rels], on_error="return")
        out: dict[str, bytes | None | Exception] = {}
        for r in rels:
            v = raw.get(self.full(r))
            out[r] = None if v is None or isinstance(v, FileNotFoundError) else v
        return out

    def _exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.full(rel)))

    def _put(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self.full(rel), data)

    def _create(self, rel: str, data: bytes) -> bool:
        full = self.full(rel)
        try:
            self.fs.pipe_file(full, data, mode="create")
        except TypeError:  # a backend without exclusive create
            if self.fs.exists(full):
                return False
            self.fs.pipe_file(full, data)
        except Exception as e:  # noqa: BLE001 - each backend says "exists" its own way
            if self._exists_error(e):
                return False
            raise
        return True

    def _exists_error(self, e: Exception) -> bool:
        """Whether ``e``, raised by an exclusive create, means that the object exists."""
        return isinstance(e, FileExistsError)

    def _rm_files(self, rels: list[str]) -> None:
        try:
            self.fs.rm([self.full(r) for r in rels])
        except FileNotFoundError:
            pass

    def _rm_tree(self, rel: str) -> None:
        self._rm_found(self.full(rel))

    def _rm_found(self, path: str) -> list[str]:
        """Delete every file below ``path``; returns their names."""
        try:
            files = list(self.fs.find(path))
        except FileNotFoundError:
            files = []
        if files:
            self.fs.rm(files)
        return files

    # -- big files: streamed through fs.open ------------------------------------------------
    def _upload_many(self, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                     spans: Spans, uploaded: Uploaded) -> list[FileEntry]:
        def once(lp: str, r: str) -> FileEntry:
            h = BlockHasher(algorithm, self.transfer.block_size, spans.get(r, ()))
            size = 0
            with open_local(lp) as fin, self.stream_fs.open(self.full(r), "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    h.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
                    progress(len(chunk))
            return FileEntry.hashed(r, size, h)

        def one(item: tuple[str, str]) -> FileEntry:
            entry = self._request(f"cannot upload {item[1]}", lambda _attempt: once(*item), self._throttle_only,
                                  upload=True)
            uploaded(entry)
            return entry

        return self._each(one, items)

    def _download_many(self, items: list[tuple[str, str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str]]:
        def once(r: str, lp: str) -> tuple[int, str]:
            h = new_hasher(algorithm)
            size = 0
            os.makedirs(os.path.dirname(lp) or ".", exist_ok=True)
            with self.stream_fs.open(self.full(r), "rb") as fin, open(lp, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    h.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
                    progress(len(chunk))
            return size, h.hexdigest()

        def one(item: tuple[str, str, int | None]) -> tuple[int, str]:
            return self._request(f"cannot download {item[0]}", lambda _attempt: once(item[0], item[1]),
                                 self._throttle_only)

        return self._each(one, items)

    def _open_read(self, rel: str) -> AbstractContextManager[Readable]:
        return self.stream_fs.open(self.full(rel), "rb")

    def _range_reader(self) -> RangeReader:
        return _CatReader(self)


class _CatReader:
    """Byte ranges through ``fs.cat_file(start=, end=)``."""

    def __init__(self, store: FsspecStore) -> None:
        self.store = store

    def read(self, rel: str, off: int, view: memoryview, progress: Progress) -> int:
        data = self.store.fs.cat_file(self.store.full(rel), start=off, end=off + len(view))
        view[:len(data)] = data
        progress(len(data))
        return len(data)

    def close(self) -> None:
        pass


def _mtime(info: dict[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        v = info.get(key)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return None
