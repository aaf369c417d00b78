"""S3 transfers on s3fs's aiobotocore client (the path before :mod:`.s3_http`; kept to measure it).

Uploads: the file is read and hashed part by part while up to ``concurrency`` parts are in flight
(a sliding window, unlike s3fs's put which waits for each batch); downloads are parallel ranged
GETs written with pwrite and hashed in order as they land.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from slurm_titan.errors import StorageError

from slurm_titan.ckpt.checksum import BlockHasher, Hasher, new_hasher
from slurm_titan.ckpt.manifest import FileEntry
from slurm_titan.ckpt.storage.base import Progress, Spans
from slurm_titan.ckpt.storage.errors import LocalFileError
from slurm_titan.ckpt.storage.s3 import S3Store
from slurm_titan.ckpt.storage.s3_http import MAX_PARTS


class S3AioStore(S3Store):
    """:class:`.s3.S3Store` whose files move on s3fs's aiobotocore client."""

    def _upload_many(self, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                     spans: Spans) -> list[FileEntry]:
        return _run(self, lambda sem: _gather_limited(
            self.transfer.file_concurrency,
            [lambda lp=lp, r=r: _s3_upload(self, lp, r, algorithm, sem, progress, spans) for lp, r in items]))

    def _download_many(self, items: list[tuple[str, str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str]]:
        return _run(self, lambda sem: _gather_limited(
            self.transfer.file_concurrency,
            [lambda r=r, lp=lp, s=s: _s3_read(self, r, algorithm, sem, progress, lp, s) for r, lp, s in items]))

    def _checksum_many(self, items: list[tuple[str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str] | Exception]:
        async def guarded(sem: asyncio.Semaphore, r: str, s: int | None) -> Any:
            try:
                return await _s3_read(self, r, algorithm, sem, progress, None, s)
            except Exception as e:  # noqa: BLE001
                return e

        return _run(self, lambda sem: _gather_limited(
            self.transfer.file_concurrency, [lambda r=r, s=s: guarded(sem, r, s) for r, s in items]))


def _read_hash(f: Any, n: int, h: Hasher) -> bytes:
    data = f.read(n)
    if data:
        h.update(data)
    return data


async def _s3_upload(store: S3Store, local_path: str, rel: str, algorithm: str, sem: asyncio.Semaphore,
                     progress: Progress, spans: Spans) -> FileEntry:
    fs = store.fs
    bucket, key, _ = fs.split_path(store.full(rel))
    h = BlockHasher(algorithm, store.transfer.block_size, spans.get(rel, ()))
    try:
        f = open(local_path, "rb")
    except OSError as e:
        raise LocalFileError(f"cannot read {local_path}: {e.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        part_size = max(store.transfer.part_size, 5 << 20, -(-size // MAX_PARTS))
        if size <= part_size:
            async with sem:
                data = await asyncio.to_thread(_read_hash, f, size + 1, h)
                await fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data)
            progress(len(data))
            return FileEntry.hashed(rel, len(data), h)
        mpu = await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key)
        upload_id = mpu["UploadId"]
        tasks: list[asyncio.Task] = []
        total = 0

        async def send(number: int, data: bytes) -> dict[str, Any]:
            try:
                out = await fs._call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                                        PartNumber=number, Body=data)
                progress(len(data))
                return {"PartNumber": number, "ETag": out["ETag"]}
            finally:
                sem.release()

        try:
            number = 0
            while True:
                await sem.acquire()
                if any(t.done() and not t.cancelled() and t.exception() for t in tasks):
                    sem.release()
                    break
                data = await asyncio.to_thread(_read_hash, f, part_size, h)
                if not data:
                    sem.release()
                    break
                number += 1
                total += len(data)
                tasks.append(asyncio.ensure_future(send(number, data)))
                del data
            parts = await asyncio.gather(*tasks)
            await fs._call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                              MultipartUpload={"Parts": list(parts)})
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            raise
    return FileEntry.hashed(rel, total, h)


async def _s3_read(store: S3Store, rel: str, algorithm: str, sem: asyncio.Semaphore, progress: Progress,
                   local_path: str | None, size: int | None) -> tuple[int, str]:
    """Download (local_path set) or just hash (None) an object with parallel ranged GETs."""
    fs = store.fs
    bucket, key, _ = fs.split_path(store.full(rel))
    part_size = store.transfer.part_size
    if size is None:
        head = await fs._call_s3("head_object", Bucket=bucket, Key=key)
        size = int(head["ContentLength"])
    h = new_hasher(algorithm)
    fd = -1
    if local_path is not None:
        try:
            os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
            fd = os.open(local_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise LocalFileError(f"cannot write {local_path}: {e.strerror}") from None
    pending: dict[int, bytes] = {}
    state = {"next": 0}
    lock = asyncio.Lock()

    async def drain() -> None:
        async with lock:
            while state["next"] in pending:
                data = pending.pop(state["next"])
                await asyncio.to_thread(h.update, data)
                state["next"] += len(data)
                sem.release()

    async def fetch(off: int, length: int) -> None:
        try:
            kw = {"Range": f"bytes={off}-{off + length - 1}"} if size > part_size or off else {}
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
            body = resp["Body"]
            try:
                data = await body.read()
            finally:
                with contextlib.suppress(Exception):
                    body.close()
        except BaseException:
            sem.release()
            raise
        if fd >= 0:
            try:
                await asyncio.to_thread(os.pwrite, fd, data, off)
            except OSError as e:
                sem.release()
                raise LocalFileError(f"cannot write {local_path}: {e.strerror}") from None
        if len(data) != length:
            sem.release()
            raise StorageError(f"{store.url(rel)}: short read at byte {off} ({len(data)} of {length} bytes)")
        progress(len(data))
        pending[off] = data
        await drain()

    tasks: list[asyncio.Task] = []
    try:
        offsets = list(range(0, size, part_size)) or [0]
        for off in offsets:
            await sem.acquire()
            if any(t.done() and not t.cancelled() and t.exception() for t in tasks):
                sem.release()
                break
            tasks.append(asyncio.ensure_future(fetch(off, min(part_size, size - off))))
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # release permits still held by fetched-but-unhashed parts
        for _ in range(len(pending)):
            sem.release()
        pending.clear()
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    return state["next"], h.hexdigest()


def _run(store: S3Store, coro_factory: Callable[[asyncio.Semaphore], Any]) -> Any:
    from fsspec.asyn import sync

    async def main() -> Any:
        sem = asyncio.Semaphore(store.transfer.concurrency)
        return await coro_factory(sem)

    return sync(store.fs.loop, main)


async def _gather_limited(n: int, factories: list[Callable[[], Any]]) -> list[Any]:
    limit = asyncio.Semaphore(n)

    async def one(fac: Callable[[], Any]) -> Any:
        async with limit:
            return await fac()

    return await asyncio.gather(*[one(f) for f in factories])
