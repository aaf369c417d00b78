"""The checkpoint store: one interface over a local folder, any fsspec filesystem and S3.

A :class:`Store` is a checkpoint location (a backend plus a root inside it); ``open_store``
(:mod:`slurm_titan.ckpt.storage`) picks the backend from the URL. The choices:

- **An ABC, not a Protocol.** The public methods hold what every backend shares (turning any
  failure into one line, once; relative paths; the bookkeeping of the bulk transfers) and a
  Protocol cannot carry code. Backends override the ``_hooks`` only, never a public method
  (torchtitan's ``BaseCheckpointManager.save``/``_save`` rule): the public method checks its
  arguments, wraps errors and redacts, and delegates. ``runtime_checkable`` :class:`RangeReader`
  is the one seam small enough to be a Protocol.
- **Paths are ``str``, relative to the root and '/'-separated**, for every backend and every
  hook: object keys are not file system paths, and one spelling keeps the records portable.
- **The bulk transfers are methods of the store** (``upload_many``, ``download_many``,
  ``checksum_many``, ``download_pieces``): each backend moves bytes its own way (the S3 fast path
  keeps parts of several files in flight, a folder copies with O_DIRECT), which a file-at-a-time
  interface would hide. Every byte is hashed exactly once, on its way through.
- **Errors** (:mod:`.errors`): :class:`StoreError` for store failures, :class:`TransientStoreError`
  where a retry may help, :class:`LocalFileError` for the local side, ``FileNotFoundError`` only
  where a missing object is a normal answer (``cat``).
- **Retries are the store's** (:mod:`.backoff`): each small operation, and each request of a bulk
  transfer (an S3 part, a range, a file on fsspec), is retried alone under the store's
  :class:`.backoff.Backoff`, waiting out a throttling store up to its deadline (other transient
  failures: a few tries; one where a library retries them itself, a small operation where
  :attr:`Store.library_retries` says so and a file that s3fs streams); a bulk transfer's requests run
  in the slots of the store's :class:`.concurrency.AdaptiveLimit`, which shrinks while the store
  throttles, an upload's at the turns of its :class:`.concurrency.Pace` (an uploader's share of the
  job's rate). A caller sees a failure only once the policy is used up.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar, runtime_checkable

from slurm_titan import envvars
from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM, Readable, hash_stream, new_hasher
from slurm_titan.ckpt.manifest import FileEntry
from slurm_titan.ckpt.storage import ranged
from slurm_titan.ckpt.storage.backoff import Backoff, WaitNotice
from slurm_titan.ckpt.storage.concurrency import AdaptiveLimit, Pace
from slurm_titan.ckpt.storage.errors import (
    StoreError,
    TransientStoreError,
    describe,
    is_transient,
    redact,
    retry_after,
    scrub,
    throttle_code,
)
from slurm_titan.ckpt.storage.range_batches import Batch, batch_ranges
from slurm_titan.errors import StorageError

log = logging.getLogger("slurm_titan.ckpt.storage")

T = TypeVar("T")
R = TypeVar("R")

Progress = Callable[[int], None]
"""Called with a number of bytes just moved (the store serializes the calls of one transfer)."""

Spans = dict[str, list[tuple[int, int]]]
"""Per stored file (rel): the (offset, length) of byte ranges to record a checksum of."""

Uploaded = Callable[[FileEntry], None]
"""Called with each file of an upload once it is stored whole (from transfer threads too)."""


@dataclass
class Entry:
    path: str
    """Relative to the store's root, '/'-separated."""
    size: int
    mtime: float | None
    is_dir: bool = False

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class TransferConfig:
    """Tuning of uploads/downloads (defaults measured on SeaweedFS over loopback, 2 cores)."""

    part_size: int = 16 << 20
    """Multipart part size (S3) and range size for downloads; grown for files so large that
    they would need more than 9,000 parts (S3 allows 10,000)."""
    min_part_size: int = 5 << 20
    """The store's smallest part but the last (S3's 5 MiB): a smaller ``part_size`` is raised to it. Only a store
    that takes smaller parts (SeaweedFS: the scale harness, which cuts its scaled-down files into as many parts as
    the real ones) lowers it."""
    concurrency: int = 8
    """Parts in flight (upload memory is bounded by concurrency x part_size = 128 MiB; the S3 path
    keeps up to 8 part buffers for the next upload). An S3 restore holds up to twice that: the
    ranges in flight and, while they wait their turn to be hashed, as many that landed early."""
    file_concurrency: int = 4
    """Files moved at once."""
    block_size: int = 16 << 20
    """Uploads record a checksum per block of this many bytes (a multiple of 4 KiB) besides the
    whole file's, so that a restore can fetch and verify any byte range on its own
    (SLURM_TITAN_CKPT_BLOCK_KB)."""
    expect_continue_min: int = 1 << 20
    """S3 (the fast path): a body of at least this many bytes is sent only once the store answers
    ``Expect: 100-continue``, so that a refused PUT costs no body bytes (botocore's threshold: smaller
    bodies are not worth the wait for the interim answer)."""
    direct_io: bool = True
    """S3 restores write large files with O_DIRECT where the file system allows it (about half
    the client CPU per GiB, measured); False writes them through the page cache."""
    upload_rate: float = 0.0
    """Upload requests (an S3 part or PutObject, a file on fsspec) this client starts a second at most, evenly
    apart (:class:`.concurrency.Pace`; 0: no pacing). A rank's uploader takes its share of
    ``checkpoint.upload_rate``; reads (a restore, the committer gathering small items) are not paced."""

    @classmethod
    def from_env(cls) -> TransferConfig:
        c = cls()
        if os.environ.get(envvars.CKPT_PART_MB):
            c.part_size = max(5, int(os.environ[envvars.CKPT_PART_MB])) << 20
        if os.environ.get(envvars.CKPT_CONCURRENCY):
            c.concurrency = max(1, int(os.environ[envvars.CKPT_CONCURRENCY]))
        if os.environ.get(envvars.CKPT_BLOCK_KB):
            c.block_size = max(4, int(os.environ[envvars.CKPT_BLOCK_KB]) // 4 * 4) << 10
        if os.environ.get(envvars.CKPT_DIRECT_IO):
            c.direct_io = os.environ[envvars.CKPT_DIRECT_IO] != "0"
        return c


@runtime_checkable
class RangeReader(Protocol):
    """Reads byte ranges of stored files into the caller's buffers (:meth:`Store.download_pieces`);
    used from several threads at once."""

    def read(self, rel: str, off: int, view: memoryview, progress: Progress) -> int:
        """Fill ``view`` from byte ``off`` of ``rel``, reporting ``progress``; returns the bytes read."""
        ...

    def close(self) -> None: ...


class Store(abc.ABC):
    """A checkpoint location. Public methods raise StoreError (one line, credentials scrubbed).

    Subclasses implement the ``_hooks`` (same arguments as the public method, paths relative to
    the root); the public methods are not overridden. A hook may raise what its library raises
    (the public method describes it in one line, transient or not) or a StorageError of its own,
    which passes through unchanged (build it with :meth:`_fail`).
    """

    library_retries: ClassVar[bool] = False
    """Whether the backend's library retries a failed small operation itself (gcsfs, adlfs ...): the store's
    policy then gives one try to a failure other than throttling."""

    def __init__(self, root: str, location: str, *, endpoint: str | None = None,
                 transfer: TransferConfig | None = None, secrets: tuple[str, ...] = (),
                 retry: Backoff | None = None, notice: Callable[[str], None] | None = None) -> None:
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.location = redact(location)
        self.endpoint = endpoint
        self.transfer = transfer or TransferConfig.from_env()
        self._secrets = secrets
        self.retry = retry or Backoff.from_env()
        """How every operation is retried (:mod:`.backoff`)."""
        self.waits = WaitNotice(notice or log.warning)
        """Where the waits for a throttling store are said (``notice``: default, the storage logger)."""
        self.limit = AdaptiveLimit(self.transfer.concurrency)
        """The slots of a bulk transfer's requests (:mod:`.concurrency`)."""
        self.upload_pace = Pace(self.transfer.upload_rate)
        """When a bulk upload's requests start (:mod:`.concurrency`)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # -- paths ---------------------------------------------------------------------------
    def full(self, rel: str = "") -> str:
        """The backend's name of ``rel`` (an absolute path, or bucket/key)."""
        rel = rel.strip("/")
        if not rel:
            return self.root
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    def url(self, rel: str = "") -> str:
        """``rel`` as a redacted URL (or path), for messages."""
        base = self.location.rstrip("/")
        rel = rel.strip("/")
        return f"{base}/{rel}" if rel else base

    def rel(self, full: str) -> str:
        """The inverse of :meth:`full`."""
        full = full.rstrip("/")
        if self.root == "/":
            return full.lstrip("/")
        prefix = self.root + "/"
        if full.startswith(prefix):
            return full[len(prefix):]
        if full == self.root:
            return ""
        raise self._fail(f"unexpected path {full!r} outside the root")

    # -- errors: the one place a failure becomes a line ----------------------------------
    def _fail(self, what: str, cause: BaseException | None = None) -> StoreError:
        """``<location>: <what>``, secrets scrubbed; transient if ``cause`` is worth retrying."""
        message = scrub(f"{self.location}: {what}", self._secrets)
        if cause is None or not is_transient(cause):
            return StoreError(message)
        return TransientStoreError(message, throttle=throttle_code(cause), retry_after=retry_after(cause))

    def _error(self, action: str, e: Exception) -> StorageError:
        if isinstance(e, StorageError):
            return e
        if isinstance(e, FileNotFoundError):
            if self._missing_bucket(e):
                return self._fail("the bucket does not exist")
            return self._fail(f"{action}: not found ({describe(e)})")
        return self._fail(f"{action}: {self._describe(e)}", e)

    @contextlib.contextmanager
    def _guard(self, action: str, missing_ok: bool = False) -> Iterator[None]:
        """Any failure inside the block becomes one line (``missing_ok``: FileNotFoundError passes)."""
        try:
            yield
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001 - every backend has its own exceptions
            if missing_ok and isinstance(e, FileNotFoundError):
                raise
            raise self._error(action, e) from None

    @property
    def _throttle_only(self) -> Backoff:
        """The store's policy for operations whose library retries other failures itself (a file that s3fs
        streams, its parts): only a throttling store is waited out."""
        return dataclasses.replace(self.retry, tries=1)

    def _retried(self, action: str, fn: Callable[[], T], *, missing_ok: bool = False) -> T:
        """A small operation: ``fn()`` under ``_guard(action)``, retried under the store's policy (a throttling
        store waited out; other failures one try where :attr:`library_retries` says the library retried them)."""
        def once(_attempt: int) -> T:
            with self._guard(action, missing_ok):
                return fn()

        return (self._throttle_only if self.library_retries else self.retry).run(once, on_wait=self.waits)

    def _request(self, action: str, fn: Callable[[int], T], policy: Backoff | None = None, *,
                 upload: bool = False) -> T:
        """One request of a bulk transfer: ``fn(attempt)`` in a slot of :attr:`limit` (an ``upload`` at its turn
        of :attr:`upload_pace`), under ``_guard(action)``, retried under ``policy`` (default: the store's, its tries
        for failures other than throttling too)."""
        def once(attempt: int) -> T:
            with self.limit.slot():
                if upload:
                    self.upload_pace.wait()
                with self._guard(action):
                    return fn(attempt)

        return (policy or self.retry).run(once, on_wait=self.waits)

    def _describe(self, e: BaseException) -> str:
        """The cause part of a failure's line."""
        return describe(e, self.endpoint)

    def _missing_bucket(self, e: FileNotFoundError) -> bool:
        """Whether ``e`` means the location's bucket is missing (object stores)."""
        return False

    # -- opening ---------------------------------------------------------------------------
    def check(self, create: bool = False) -> None:
        """Fail now, with one line, if the location is unreachable, refused or missing
        (``create``: make a missing local folder); only a throttling store is waited out."""
        self._retried("cannot open the checkpoint location", lambda: self._check(create))

    # -- listing ---------------------------------------------------------------------------
    def ls(self, rel: str = "") -> list[Entry]:
        """Entries directly under ``rel`` (one LIST request on object stores); [] if none."""
        return self._retried(f"cannot list {rel or 'the location'}",
                             lambda: sorted(self._ls(rel), key=lambda e: e.path))

    def find(self, rel: str = "") -> list[Entry]:
        """All files below ``rel``, recursively (one paginated LIST on object stores); [] if none."""
        return self._retried(f"cannot list {rel or 'the location'}",
                             lambda: sorted(self._find(rel), key=lambda e: e.path))

    # -- small objects ---------------------------------------------------------------------
    def cat(self, rel: str) -> bytes:
        """The contents of ``rel``; FileNotFoundError if there is none."""
        try:
            return self._retried(f"cannot read {rel}", lambda: self._cat(rel), missing_ok=True)
        except FileNotFoundError:
            raise FileNotFoundError(rel) from None

    def cat_many(self, rels: list[str]) -> dict[str, bytes | None]:
        """Contents of several small objects at once (None for missing ones)."""
        if not rels:
            return {}

        def read() -> dict[str, bytes | None]:
            got = self._cat_many(rels)
            out: dict[str, bytes | None] = {}
            for r in rels:
                v = got.get(r)
                if isinstance(v, Exception):
                    raise self._error(f"cannot read {r}", v)
                out[r] = v
            return out

        return self._retried("cannot read records", read)

    def exists(self, rel: str) -> bool:
        return self._retried(f"cannot check {rel}", lambda: self._exists(rel))

    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write a small object, replacing it; never visible half-written."""
        self._retried(f"cannot write {rel}", lambda: self._put(rel, data))

    def create_bytes(self, rel: str, data: bytes) -> bool:
        """Write a small object atomically if it does not exist yet; False if it already exists
        (the commit record's guarantee: of two writers exactly one wins)."""
        return self._retried(f"cannot write {rel}", lambda: self._create(rel, data))

    # -- deletion --------------------------------------------------------------------------
    def rm_files(self, rels: list[str]) -> None:
        """Delete files (missing ones are no error)."""
        if rels:
            self._retried("cannot delete", lambda: self._rm_files(rels))

    def rm_tree(self, rel: str) -> None:
        """Delete everything below ``rel`` (never the whole location)."""
        if not rel.strip("/"):
            raise self._fail("refusing to delete the whole location")
        self._retried(f"cannot delete {rel}", lambda: self._rm_tree(rel))

    # -- big files ---------------------------------------------------------------------------
    def upload_many(self, items: list[tuple[str, str]], progress: Progress | None = None,
                    algorithm: str | None = None, spans: Spans | None = None,
                    uploaded: Uploaded | None = None) -> list[FileEntry]:
        """Upload [(local_path, rel)] concurrently; returns FileEntries in the same order, with block
        checksums and a checksum of each of ``spans[rel]`` (offset, length) of a file. ``uploaded`` is
        told of each file once it is stored whole, so that a caller retrying after a failure can leave
        those out.

        Raises LocalFileError when a local file cannot be read (not worth retrying) and a
        StoreError (TransientStoreError where worth retrying) when the store fails."""
        if not items:
            return []
        with self._guard("upload failed"):
            return self._upload_many(items, algorithm or DEFAULT_ALGORITHM, _serialized(progress), spans or {},
                                     uploaded or _ignore)

    def download_many(self, items: list[tuple[str, str, int | None]], progress: Progress | None = None,
                      algorithm: str | None = None) -> list[tuple[int, str]]:
        """Download [(rel, local_path, size or None)]; returns [(size, checksum)] in order."""
        if not items:
            return []
        with self._guard("download failed"):
            return self._download_many(items, algorithm or DEFAULT_ALGORITHM, _serialized(progress))

    def checksum_many(self, items: list[tuple[str, int | None]], algorithm: str,
                      progress: Progress | None = None) -> list[tuple[int, str] | StorageError]:
        """(size, checksum) of stored objects [(rel, size or None)], streaming them; a one-line
        error in place of each one that could not be read."""
        if not items:
            return []
        with self._guard("cannot read"):
            results = self._checksum_many(items, algorithm, _serialized(progress))
        return [self._error(f"cannot read {rel}", r) if isinstance(r, Exception) else r
                for (rel, _), r in zip(items, results)]

    def read_ranges(self, items: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes of ranges of stored files, [(rel, offset, length)], into memory, in order: small ones (a
        committer gathering the checkpoint's small items, :func:`.commit.gather_spans`), nearby ranges of a
        file with one request (:mod:`.range_batches`). Raises StorageError when the store fails, or a range
        is short."""
        if not items:
            return []
        batches = batch_ranges(items)
        with self._guard("cannot read"):
            reader = self._range_reader()

        def one(batch: Batch) -> bytes:
            buf = bytearray(batch.length)
            got = self._request(f"cannot read {batch.rel}",
                                lambda _attempt: reader.read(batch.rel, batch.offset, memoryview(buf), _noop))
            if got != batch.length:
                raise StoreError(f"{self.url(batch.rel)}: short read at byte {batch.offset} ({got} of "
                                 f"{batch.length} bytes)")
            return bytes(buf)

        out: list[bytes] = [b""] * len(items)
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(self.transfer.concurrency, len(batches))),
                                    thread_name_prefix="ckpt-range") as pool:
                for batch, data in zip(batches, pool.map(one, batches)):
                    for index, start, n in batch.members:
                        out[index] = data[start:start + n]
        finally:
            reader.close()
        return out

    def download_pieces(self, items: list[tuple[str, str, int, list[tuple[int, int, str]]]], algorithm: str,
                        progress: Progress | None = None) -> list[list[tuple[int, int]]]:
        """Fetch byte ranges of files: [(rel, local path, file size, [(offset, length, checksum)])].

        Each local file is created at its full size (sparse: what is not fetched is a hole) and each
        piece (a block of the record, or a span) is fetched, checked against its checksum and written
        at its offset (O_DIRECT where aligned and allowed). Returns, per item, the (offset, length) of
        the pieces whose bytes did not match (all good: empty lists). Raises StorageError when the
        store or the disk fails; the first failure ends the fetch (no piece still waiting its turn is
        requested: a store that refuses every request ends it in one retry budget)."""
        if not items:
            return []
        progress = _serialized(progress)
        size = max((n for *_, pieces in items for _, n, _ in pieces), default=1)
        buffers = ranged.PartBuffers(-(-size // ranged.ALIGN) * ranged.ALIGN)
        writers: list[ranged.Writer] = []
        bad: list[list[tuple[int, int]]] = [[] for _ in items]
        lock = threading.Lock()
        failed = threading.Event()
        with self._guard("cannot read"):
            reader = self._range_reader()

        def one(i: int, w: ranged.Writer, rel: str, off: int, n: int, checksum: str) -> None:
            if failed.is_set():
                return
            buf = buffers.take()
            try:
                view = memoryview(buf)[:n]
                got = self._request(f"cannot read {rel}", lambda _attempt: reader.read(rel, off, view, progress))
                if got != n:
                    raise StoreError(f"{self.url(rel)}: short read at byte {off} ({got} of {n} bytes)")
                h = new_hasher(algorithm)
                h.update(view)
                if h.hexdigest() != checksum:
                    with lock:
                        bad[i].append((off, n))
                    return
                try:
                    w.write(off, view)
                except OSError as e:
                    raise StorageError(f"cannot write {w.path}: {e.strerror}") from None
            except BaseException:
                failed.set()
                raise
            finally:
                buffers.give([buf])

        try:
            tasks = []
            for i, (rel, lp, fsize, pieces) in enumerate(items):
                try:
                    os.makedirs(os.path.dirname(lp) or ".", exist_ok=True)
                    fd = os.open(lp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.ftruncate(fd, fsize)
                except OSError as e:
                    raise StorageError(f"cannot write {lp}: {e.strerror}") from None
                w = ranged.Writer(fd, lp, self.transfer.direct_io)
                writers.append(w)
                tasks += [(i, w, rel, off, n, c) for off, n, c in pieces]
            with ThreadPoolExecutor(max_workers=max(1, min(self.transfer.concurrency, len(tasks) or 1)),
                                    thread_name_prefix="ckpt-piece") as pool:
                for fut in [pool.submit(one, *t) for t in tasks]:
                    fut.result()
        finally:
            reader.close()
            for w in writers:
                w.close()
                os.close(w.fd)
            buffers.close()
        for b in bad:
            b.sort()
        return bad

    # -- shared by the backends --------------------------------------------------------------
    def _each(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """``fn`` of every item, ``transfer.file_concurrency`` at once, in order."""
        if len(items) == 1:
            return [fn(items[0])]
        with ThreadPoolExecutor(max_workers=max(1, min(self.transfer.file_concurrency, len(items)))) as pool:
            return list(pool.map(fn, items))

    def _cat_many(self, rels: list[str]) -> dict[str, bytes | None | Exception]:
        """Default: one ``_cat`` after the other."""
        out: dict[str, bytes | None | Exception] = {}
        for r in rels:
            try:
                out[r] = self._cat(r)
            except FileNotFoundError:
                out[r] = None
            except Exception as e:  # noqa: BLE001 - reported per record by cat_many
                out[r] = e
        return out

    # -- the hooks ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _check(self, create: bool) -> None: ...

    @abc.abstractmethod
    def _ls(self, rel: str) -> Iterable[Entry]: ...

    @abc.abstractmethod
    def _find(self, rel: str) -> Iterable[Entry]: ...

    @abc.abstractmethod
    def _cat(self, rel: str) -> bytes: ...

    @abc.abstractmethod
    def _exists(self, rel: str) -> bool: ...

    @abc.abstractmethod
    def _put(self, rel: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _create(self, rel: str, data: bytes) -> bool: ...

    @abc.abstractmethod
    def _rm_files(self, rels: list[str]) -> None: ...

    @abc.abstractmethod
    def _rm_tree(self, rel: str) -> None: ...

    @abc.abstractmethod
    def _upload_many(self, items: list[tuple[str, str]], algorithm: str, progress: Progress,
                     spans: Spans, uploaded: Uploaded) -> list[FileEntry]: ...

    @abc.abstractmethod
    def _download_many(self, items: list[tuple[str, str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str]]: ...

    def _checksum_many(self, items: list[tuple[str, int | None]], algorithm: str,
                       progress: Progress) -> list[tuple[int, str] | Exception]:
        """Default: each file hashed as it streams from :meth:`_open_read`; a failure is that file's result."""
        def once(rel: str) -> tuple[int, str]:
            with self._open_read(rel) as fin:
                return hash_stream(fin, algorithm, progress)

        def one(item: tuple[str, int | None]) -> tuple[int, str] | Exception:
            try:
                return self._request(f"cannot read {item[0]}", lambda _attempt: once(item[0]), self._throttle_only)
            except Exception as e:  # noqa: BLE001 - reported per file
                return e

        return self._each(one, items)

    def _open_read(self, rel: str) -> contextlib.AbstractContextManager[Readable]:
        """A binary file object for reading `rel` whole (for the default :meth:`_checksum_many`)."""
        raise NotImplementedError(f"{type(self).__name__} reads whole files its own way")

    @abc.abstractmethod
    def _range_reader(self) -> RangeReader: ...


def _noop(_: int) -> None:
    pass


def _ignore(_: FileEntry) -> None:
    pass


def _serialized(progress: Progress | None) -> Progress:
    """``progress`` behind a lock: transfers call it from many threads."""
    if progress is None:
        return _noop
    lock = threading.Lock()

    def cb(n: int) -> None:
        with lock:
            progress(n)

    return cb

