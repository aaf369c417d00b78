"""Per-rank background upload of checkpoints, and the thread that runs rank 0's commit.

Every rank runs one :class:`CheckpointSync`. After torchtitan's save of step N returns on a
rank, ``submit(N)`` queues the upload of that rank's own files of ``<local>/step-N/``
(``__R_*.distcp``; rank 0 also ``.metadata`` and anything else) and returns at once; a
background thread uploads them and then writes the rank's receipt (files, sizes, checksums).
The store retries each request alone (a part, under its policy: :mod:`.storage.backoff`); when one
is still refused after that, this thread tries again (full-jitter exponential backoff, so that
ranks do not come back in lockstep) with the files that are not stored whole yet.

Rank 0 also runs a committer thread: for each step, in order, it runs the commit protocol
(:func:`.commit.commit`: all receipts, sizes against one listing, the commit record last and
create-only, the catalog entry), then remote retention. A checkpoint without a commit record
is incomplete: never listed complete, never restored.

``wait(step, timeout)`` blocks until this rank's part of the step (and, on rank 0, the
commit) is done: the preemption path calls it before the job lets go of the node.

:class:`Uploader` is what a rank's checkpointer calls: CheckpointSync in-process, or
:class:`.upload_process.UploaderProcess` (the same calls, served by a child process).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from slurm_titan import envvars
from slurm_titan.ckpt import commit, layout
from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM
from slurm_titan.ckpt.manifest import FileEntry, ManifestError, Range, Receipt, utc_iso
from slurm_titan.ckpt.retention import prune
from slurm_titan.ckpt.storage import Backoff, LocalFileError, Store, SystemClock, TransferConfig, Wait, open_store
from slurm_titan.ckpt.upload_process import UploadSettings
from slurm_titan.errors import StorageError
from slurm_titan.retention import KEEP_ALL, Retention
from slurm_titan.thread_priority import background_thread

log = logging.getLogger("slurm_titan.ckpt.upload")

T = TypeVar("T")

RETRY_MAX_S = 20.0
"""The longest wait between two tries of a rank's upload, its receipt or its commit (full jitter, growing from
``retry_initial``): after an outage the uploads resume within this of the store's return. A store that throttles is
waited out inside each try (:class:`.storage.Backoff`), so this bounds how often an unreachable store is asked: every
10 s on average, per rank.
"""


@runtime_checkable
class Uploader(Protocol):
    """A rank's uploader: :class:`CheckpointSync`, or :class:`.upload_process.UploaderProcess`
    (``runtime_checkable``: the tests assert that both are one)."""

    def submit(self, step: int, reads: list[Range] | None = None,
               spans: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """Queue the upload of this rank's files of step N (returns at once)."""

    def submitted(self, step: int) -> bool:
        """Whether step N was submitted here."""

    def wait(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Block until this rank's part of ``step`` (rank 0: the commit; None: every step) is done;
        True if it succeeded."""

    def status(self, step: int) -> str:
        """What became of step N (``failed: <why>`` when it failed)."""

    def in_flight(self) -> set[int]:
        """Steps submitted whose upload (rank 0: commit) has not finished."""

    def close(self, timeout: float | None = None) -> bool:
        """Finish what was submitted (up to ``timeout`` s), then stop; True if all of it succeeded."""


def default_attempt() -> str:
    """An id shared by all ranks of one run attempt and different for the next attempt.

    envvars.ATTEMPT if set (the node supervisor's); else the Slurm job id + restart count (+ torchelastic
    restart count); else torchelastic's run id; else '' (receipts of any attempt are accepted).
    """
    if os.environ.get(envvars.ATTEMPT):
        return os.environ[envvars.ATTEMPT]
    parts = []
    if os.environ.get("SLURM_JOB_ID"):
        parts.append("slurm-" + envvars.attempt_id(os.environ["SLURM_JOB_ID"],
                                                   int(os.environ.get("SLURM_RESTART_COUNT", "0"))))
    elif os.environ.get("TORCHELASTIC_RUN_ID"):
        parts.append(f"elastic-{os.environ['TORCHELASTIC_RUN_ID']}")
    if parts and os.environ.get("TORCHELASTIC_RESTART_COUNT"):
        parts.append(f"r{os.environ['TORCHELASTIC_RESTART_COUNT']}")
    return ".".join(parts)


@dataclass
class _Step:
    step: int
    saved_at: str
    uploaded: threading.Event = field(default_factory=threading.Event)
    committed: threading.Event = field(default_factory=threading.Event)
    status: str = "queued"
    error: str = ""
    reads: list[Range] | None = None
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


class CheckpointSync:
    """Background uploader (every rank) and committer (rank 0) for one run.

    Args:
        remote: the run's remote location (URL or path) or an open :class:`Store`.
        local_folder: torchtitan's checkpoint folder on this node (holds ``step-N/``).
        rank, world_size: global rank and world size of the training job.
        config_digest: recorded in the commit record (envvars.CONFIG_DIGEST).
        attempt: id of this run attempt (default :func:`default_attempt`); receipts of other
            attempts are ignored by the committer.
        retention: ``keep_local``: keep this many newest step folders on local disk (0: keep all); a
            step's local files are deleted only after this rank uploaded them. ``keep_remote``,
            ``keep_every``: remote retention applied by rank 0 after each commit (0: keep all).
        endpoint_url: the S3 endpoint (``checkpoint.endpoint_url``; None: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
        nice: how much lower than training's the CPU priority of the upload and commit threads
            (and the transfer threads they start) is: training keeps the cores it needs and the
            upload takes what is left (0: same priority).
        upload_cpus: the CPUs those threads run on (None: training's); see ``checkpoint.upload_cpus``.
        upload_rate: requests a second all ranks' uploads make at most (``checkpoint.upload_rate``): this rank's
            store paces its requests at ``upload_rate / world_size`` (0: no pacing; a given :class:`Store` keeps
            its own transfer settings).

    :meth:`from_settings` builds one from a rank's :class:`.upload_process.UploadSettings`.

    Raises StorageError (one line) at construction if the remote is unreachable.
    """

    def __init__(self, remote: str | Store, local_folder: str, *, rank: int = 0, world_size: int = 1,
                 config_digest: str = "", attempt: str | None = None, retention: Retention = KEEP_ALL,
                 endpoint_url: str | None = None, storage_options: dict | None = None, retry_initial: float = 1.0,
                 retry_max: float = RETRY_MAX_S, poll_interval: float = 1.0, algorithm: str = DEFAULT_ALGORITHM,
                 nice: int = 10, upload_cpus: frozenset[int] | None = None, upload_rate: float = 0.0) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad rank {rank} / world size {world_size}")
        self.store = remote if isinstance(remote, Store) else open_store(
            remote, endpoint_url=endpoint_url, storage_options=storage_options, check=True, create=True,
            transfer=dataclasses.replace(TransferConfig.from_env(), upload_rate=upload_rate / world_size))
        self.local_folder = os.path.abspath(local_folder)
        self.rank, self.world_size = rank, world_size
        self.config_digest = config_digest
        self.attempt = default_attempt() if attempt is None else attempt
        self.data_dir = layout.attempt_dir(self.attempt)
        """Where this attempt uploads its files in each step folder (:func:`.layout.data_key`)."""
        self.keep_local, self.keep_remote, self.keep_every = (retention.keep_local, retention.keep_remote,
                                                              retention.keep_every)
        self.retry_initial, self.retry_max, self.poll_interval = retry_initial, retry_max, poll_interval
        self._backoff = Backoff(total=math.inf, tries=None, first=retry_initial, cap=retry_max)
        self.algorithm, self.nice, self.cpus = algorithm, nice, upload_cpus
        self.host = socket.gethostname()
        self._steps: dict[int, _Step] = {}
        self._lock = threading.Lock()
        self._uploads: queue.Queue[int | None] = queue.Queue()
        self._commits: queue.Queue[int | None] = queue.Queue()
        self._stop = threading.Event()
        self._closed = False
        self._uploaded_steps: set[int] = set()
        self._uploader = threading.Thread(target=self._upload_loop, name=f"ckpt-upload-r{rank}", daemon=True)
        self._committer = (threading.Thread(target=self._commit_loop, name="ckpt-commit", daemon=True)
                           if rank == 0 else None)
        self._started = False

    @classmethod
    def from_settings(cls, settings: UploadSettings) -> CheckpointSync:
        """The uploader `settings` describe (what a rank's uploader process runs)."""
        return cls(settings.remote, settings.local_folder, rank=settings.rank, world_size=settings.world_size,
                   config_digest=settings.config_digest, attempt=settings.attempt, retention=settings.retention,
                   endpoint_url=settings.endpoint_url, nice=settings.nice, upload_cpus=settings.upload_cpus,
                   upload_rate=settings.upload_rate)

    # ------------------------------------------------------------------------------ API
    def submit(self, step: int, reads: list[Range] | None = None,
               spans: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """Queue the upload of this rank's files of ``<local>/step-N`` (returns at once).

        ``reads``: the byte ranges this rank's DCP load of the step reads (:mod:`slurm_titan.rank.dcp_plan`),
        put in its receipt; when every rank's receipt has them, the commit record gets a read
        map and a restore on the same world size fetches each node's share only. ``spans``: per
        file of this rank (path inside the step folder), the (offset, length) of its small DCP
        items, checksummed on their own so that other ranks' reads of them are fetched exactly."""
        step = int(step)
        with self._lock:
            if self._closed:
                raise RuntimeError("CheckpointSync is closed")
            if step in self._steps:
                log.warning("checkpoint step %d was already submitted; ignoring", step)
                return
            self._steps[step] = _Step(step, utc_iso(), reads=reads, spans=spans or {})
            if not self._started:
                self._uploader.start()
                if self._committer is not None:
                    self._committer.start()
                self._started = True
        self._uploads.put(step)

    def wait(self, step: int | None = None, timeout: float | None = None) -> bool:
        """Block until this rank's upload (rank 0: and the commit) of ``step`` is done.

        ``step=None`` waits for every submitted step. True if it finished successfully, False
        on timeout or failure (see :meth:`status`). A step never submitted counts as done.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            steps = [self._steps[s] for s in sorted(self._steps)] if step is None else (
                [self._steps[step]] if step in self._steps else [])
        ok = True
        for st in steps:
            ev = st.committed if self.rank == 0 else st.uploaded
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not ev.wait(left):
                return False
            ok = ok and not st.error
        return ok

    def status(self, step: int) -> str:
        """queued | uploading | uploaded | committed | already-committed | failed: <why> | unknown."""
        st = self._steps.get(step)
        if st is None:
            return "unknown"
        return f"failed: {st.error}" if st.error else st.status

    def in_flight(self) -> set[int]:
        """Steps submitted here whose upload/commit has not finished (never pruned)."""
        with self._lock:
            ev = "committed" if self.rank == 0 else "uploaded"
            return {s for s, st in self._steps.items() if not getattr(st, ev).is_set()}

    def submitted(self, step: int) -> bool:
        with self._lock:
            return int(step) in self._steps

    @property
    def latest_submitted(self) -> int | None:
        with self._lock:
            return max(self._steps) if self._steps else None

    def close(self, timeout: float | None = None) -> bool:
        """Finish pending uploads and commits (up to ``timeout`` s), then stop the threads.

        Returns True if everything submitted was uploaded (rank 0: committed)."""
        with self._lock:
            self._closed = True
            started = self._started
        if not started:
            return True
        if not self._uploader.is_alive() and (self._committer is None or not self._committer.is_alive()):
            return self.wait(None, 0)  # closed before
        deadline = None if timeout is None else time.monotonic() + timeout
        self._uploads.put(None)
        done = self._join(self._uploader, deadline)
        if self._committer is not None:
            self._commits.put(None)
            done = self._join(self._committer, deadline) and done
        if not done:
            self._stop.set()
            log.error("checkpoint uploads still pending at close (gave up after %.0f s): steps %s",
                      timeout or 0, sorted(self.in_flight()))
            return False
        return self.wait(None, 0)

    @staticmethod
    def _join(t: threading.Thread, deadline: float | None) -> bool:
        while t.is_alive():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            t.join(60 if left is None else min(left, 60))
            if t.is_alive() and left is None:
                log.info("waiting for checkpoint uploads to finish (%s)", t.name)
        return True

    # ------------------------------------------------------------------------------ retry
    def _retrying(self, what: str, fn: Callable[[], T], step: _Step) -> T:
        """Run fn() until it succeeds or close gives up: any failure but a local file's or a record's is
        tried again after a full-jitter exponential backoff (bounds from ``retry_initial`` up to ``retry_max`` s)."""
        tries, last_log = 0, -math.inf

        def waiting(wait: Wait) -> None:
            nonlocal tries, last_log
            tries = wait.tries
            now = time.monotonic()
            if tries == 1 or now - last_log > 60:
                transient = getattr(wait.error, "transient", None)
                log.log(logging.WARNING if transient is not False else logging.ERROR,
                        "checkpoint step %d: %s failed (try %d, retrying in %.1f s): %s",
                        step.step, what, tries, wait.delay, wait.error)
                last_log = now

        def retryable(e: BaseException) -> bool:
            return not isinstance(e, (LocalFileError, ManifestError)) and not self._stop.is_set()

        try:
            out = self._backoff.run(lambda _attempt: fn(), on_wait=waiting, retryable=retryable,
                                         clock=SystemClock(self._stop))
        except Exception as e:  # noqa: BLE001 - storage backends raise anything
            if self._stop.is_set() and not isinstance(e, (LocalFileError, ManifestError)):
                raise StorageError(f"{what}: given up at close: {e}") from None
            raise
        if tries:
            log.warning("checkpoint step %d: %s succeeded after %d retries", step.step, what, tries)
        return out

    # ------------------------------------------------------------------------------ upload
    def _own_files(self, step: int) -> list[tuple[str, str]]:
        """[(local path, path inside step-N)] of the files this rank uploads."""
        root = os.path.join(self.local_folder, layout.step_dir(step))
        if not os.path.isdir(root):
            raise LocalFileError(f"local checkpoint folder {root} does not exist")
        out = []
        for dirpath, dirs, files in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
            if rel_dir and layout.is_meta(rel_dir):
                dirs[:] = []
                continue
            dirs[:] = [d for d in dirs if not layout.is_meta(f"{rel_dir}/{d}".lstrip("/"))]
            for name in files:
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if layout.is_temporary(rel) or name.startswith(".part-"):
                    continue
                if layout.file_owner(rel) == self.rank:
                    out.append((os.path.join(dirpath, name), rel))
        return sorted(out, key=lambda x: x[1])

    def _upload_loop(self) -> None:
        background_thread(self.nice, self.cpus)
        while True:
            step = self._uploads.get()
            if step is None:
                return
            st = self._steps[step]
            try:
                self._upload_step(st)
            except Exception as e:  # noqa: BLE001 - never kill the thread
                st.error = st.error or str(e)
                log.error("checkpoint step %d: upload failed: %s", step, e)
            finally:
                st.uploaded.set()
                if self.rank != 0 or st.error or st.status == "already-committed":
                    st.committed.set()
            if self.rank == 0 and not st.committed.is_set():
                self._commits.put(step)
            if not st.error:
                self._uploaded_steps.add(step)
                try:
                    self._prune_local()
                except Exception as e:  # noqa: BLE001
                    log.warning("local checkpoint cleanup failed: %s", e)

    def _upload_step(self, st: _Step) -> None:
        step = st.step
        st.status = "uploading"

        def committed() -> bool:  # the upload's first request, at its turn: every rank's save begins at once
            self.store.upload_pace.wait()
            return commit.is_committed(self.store, step)

        if self._retrying("checking the commit record", committed, st):
            log.warning("checkpoint step %d is already committed at %s; keeping that one, not uploading",
                        step, self.store.url(layout.step_dir(step)))
            st.status = "already-committed"
            return
        began = time.monotonic()
        try:
            files = self._own_files(step)
            items = [(lp, layout.data_key(step, self.data_dir, rel)) for lp, rel in files]
            spans = {layout.data_key(step, self.data_dir, r): v for r, v in st.spans.items()}
            stored: dict[str, FileEntry] = {}  # the files stored whole: a retry sends only the others

            def upload() -> list[FileEntry]:
                self.store.upload_many([item for item in items if item[1] not in stored], algorithm=self.algorithm,
                                       spans=spans, uploaded=lambda e: stored.__setitem__(e.path, e))
                return [stored[rel] for _, rel in items]

            entries = self._retrying(f"upload of {len(files)} file(s)", upload, st)
        except LocalFileError as e:
            st.error = f"rank {self.rank}: {e}"
            receipt = Receipt(step, self.rank, self.world_size, self.attempt, [], self.algorithm,
                              uploaded_at=utc_iso(), saved_at=st.saved_at, failed=st.error)
            self._retrying("writing the failure receipt", lambda: commit.write_receipt(self.store, receipt), st)
            raise
        prefix = len(layout.data_key(step, self.data_dir, ""))
        entries = [dataclasses.replace(e, path=e.path[prefix:]) for e in entries]  # paths inside step-N
        receipt = Receipt(step, self.rank, self.world_size, self.attempt, entries, self.algorithm,
                          uploaded_at=utc_iso(), saved_at=st.saved_at, reads=st.reads)
        self._retrying("writing the receipt", lambda: commit.write_receipt(self.store, receipt), st)
        nbytes = sum(e.size for e in entries)
        secs = time.monotonic() - began
        log.info("checkpoint step %d: rank %d uploaded %d file(s), %.1f MiB in %.1f s (%.0f MiB/s)", step,
                 self.rank, len(entries), nbytes / 2**20, secs, nbytes / 2**20 / max(secs, 1e-6))
        st.status = "uploaded"

    # ------------------------------------------------------------------------------ commit
    def _commit_loop(self) -> None:
        background_thread(self.nice, self.cpus)
        while True:
            step = self._commits.get()
            if step is None:
                return
            st = self._steps[step]
            try:
                self._commit_step(st)
            except Exception as e:  # noqa: BLE001
                st.error = st.error or str(e)
                log.error("checkpoint step %d: not committed: %s", step, e)
            finally:
                st.committed.set()
            if st.status == "committed" and (self.keep_remote or self.keep_every):
                try:
                    prune(self.store, self.keep_remote, self.keep_every, protected=self.in_flight())
                except Exception as e:  # noqa: BLE001
                    log.warning("remote checkpoint retention failed: %s", e)

    def _commit_step(self, st: _Step) -> None:
        manifest = commit.commit(self.store, st.step, world_size=self.world_size, attempt=self.attempt,
                                 algorithm=self.algorithm, config_digest=self.config_digest, saved_at=st.saved_at,
                                 committed_by=self.host, retry=lambda what, fn: self._retrying(what, fn, st),
                                 stop=self._stop, poll_interval=self.poll_interval)
        st.status = "committed" if manifest is not None else "already-committed"

    # ------------------------------------------------------------------------------ local
    def _prune_local(self) -> None:
        """Delete this rank's files of older local steps, keeping the newest ``keep_local``."""
        if self.keep_local <= 0 or not os.path.isdir(self.local_folder):
            return
        steps = sorted(s for s in (layout.parse_step_dir(n) for n in os.listdir(self.local_folder)) if s is not None)
        keep = set(steps[-self.keep_local:])
        for s in steps:
            if s in keep:
                continue
            root = os.path.join(self.local_folder, layout.step_dir(s))
            if commit.has_local_record(root):
                shutil.rmtree(root, ignore_errors=True)  # a restored copy: complete remotely
                continue
            if s not in self._uploaded_steps:
                continue  # never delete what this process has not uploaded
            try:
                for lp, _ in self._own_files(s):
                    try:
                        os.unlink(lp)
                    except FileNotFoundError:
                        pass
            except LocalFileError:
                continue
            for dirpath, _dirs, _files in os.walk(root, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
