"""The commit protocol: how a checkpoint becomes complete, and how it stops being complete.

**Invariant: a checkpoint is complete if and only if its commit record exists**
(``step-N/.slurm-titan/commit.json``, :func:`.layout.commit_path`). Listing (:mod:`.catalog`),
restore (:mod:`.restore`) and retention (:mod:`.retention`) go by that alone (a catalog entry
stands for a record: it is written after the record and deleted before it): a step folder
without the record is incomplete whatever it holds, and is never restored.

Making step N complete, in the order of this file:

1. each rank uploads its own files of ``step-N/`` into its attempt's folder ``step-N/attempt-<A>/``
   (:mod:`.upload`, :func:`.layout.data_key`), then writes its part of the record (its read map,
   :mod:`.parts`) and its receipt, also in its attempt's folder (:func:`write_receipt`): every file's size
   and the checksum of the bytes it sent, its part's name, size and checksum, or why it failed;
2. rank 0 waits until the receipts of all ``world_size`` ranks of this attempt are there
   (:func:`wait_for_receipts`: each poll lists them and reads only those that are new or changed,
   :class:`ReceiptPoll`), refuses a failed rank or a file uploaded twice
   (:func:`checked_files`), and checks every file's and part's size against one listing of the
   step folder (:func:`check_sizes`);
3. it gathers every file's spans (the small items other ranks read: replicated ones, at the heads of
   the files) into one object, each checked against the checksum its rank recorded, written
   create-only under a name of its own (:func:`gather_spans`): a node then fetches them with one GET,
   not one per file;
4. only then does it write the commit record's index (format 2: O(files + ranks), naming every
   part with its checksum and the attempt folder the files are in; :mod:`.manifest`), create-only
   (``Store.create_bytes``: S3 one conditional PUT, the index being bounded below the single-PUT
   limit; a directory a temporary file hard-linked into place), so the record appears whole or not
   at all and is never replaced, and reads it back: the committer whose record is there has committed;
5. then the catalog entry (:func:`.layout.catalog_entry`), which saves a listing from reading
   the record.

Checksums are not recomputed at commit (but for the small spans it gathers): they are the uploading
rank's, and every restore and ``verify`` checks them.

Unmaking it (:func:`delete_checkpoint`): catalog entry first, then the commit record, then the
files.

What a crash leaves behind, and why that is safe:

- in 1 or 2: files and receipts, no record: incomplete, never restored. A later attempt that
  saves the step again uploads into its own folder beside it (its committer reads only its own
  attempt's receipts); else retention deletes it once a newer checkpoint is complete.
- in 3: a gathered object no record names: incomplete, deleted with the step folder.
- in 4: the record exists whole or not at all.
- between 4 and 5: complete without a catalog entry: listed complete ("no catalog entry"), at
  the cost of one more listing of that folder.
- while deleting: after the entry went, a complete checkpoint without an entry; after the
  record went, an incomplete one. Never a "complete" checkpoint with holes.
- two committers of one step (the rank 0 of an earlier attempt still running): the first
  record stays; the second committer finds it there and keeps it ("already-committed").
- a stale attempt (a node cut off that kept running, an uploader frozen and thawed) that uploads
  a step after a newer attempt committed it: it writes only into its own attempt's folders, which
  the record does not name; the committed files are never overwritten.
- a later attempt saving a step that is already complete: each rank finds the record
  (:func:`is_committed`) and uploads nothing, so a complete checkpoint is never overwritten.

Collective contracts (who calls what):

- every rank, once per saved step, after torchtitan's save of the step returned on that rank:
  ``CheckpointSync.submit(N)`` (:mod:`.upload`), which uploads and then calls
  :func:`write_receipt`. No collective: the receipts in the store are the only rendezvous, so
  a rank that never uploads leaves the step incomplete, and rank 0's committer waits for it in
  its own thread (until ``close`` gives up), never inside a torch.distributed call.
- rank 0 only, for each step in the order submitted: :func:`commit` (CheckpointSync's
  committer thread), then remote retention (:func:`.retention.prune`, deleting with
  :func:`delete_checkpoint`). ``slurm-titan ckpt prune`` deletes the same way.
- each node once, before its ranks load: :func:`.restore.prepare_resume`. It restores only a
  complete checkpoint; the local copy appears under its final name, its commit record included,
  only once every file is verified (so it is complete by the same rule); newer local steps
  without a record are moved aside (:func:`has_local_record`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import CheckpointInfo
from slurm_titan.ckpt.checksum import hash_bytes
from slurm_titan.ckpt.manifest import (
    INDEX_MAX_BYTES,
    FileEntry,
    GatheredRef,
    Manifest,
    PartRef,
    Receipt,
    gathered_layout,
    utc_iso,
)
from slurm_titan.ckpt.parts import write_part
from slurm_titan.ckpt.share import merged
from slurm_titan.ckpt.storage import Entry, Store
from slurm_titan.errors import StorageError

log = logging.getLogger("slurm_titan.ckpt.commit")

T = TypeVar("T")
GATHERED_MAX_BYTES = 64 << 20
"""Spans beyond this, in all (a record whose ranks checksummed large items on their own), stay in their files."""


class Retry(Protocol):
    """``retry(what, fn)``: fn() until it succeeds; StorageError when given up (at close)."""

    def __call__(self, what: str, fn: Callable[[], T]) -> T: ...


def is_committed(store: Store, step: int) -> bool:
    """Whether step N is complete at ``store``: its commit record exists."""
    return store.exists(layout.commit_path(step))


def has_local_record(step_folder: str) -> bool:
    """Whether a local ``step-N`` folder holds a commit record (a restored copy, complete)."""
    return os.path.exists(os.path.join(step_folder, layout.COMMIT_RECORD))


# ------------------------------------------------------------------------------ 1. every rank
def write_receipt(store: Store, receipt: Receipt) -> None:
    """A rank's part of the step is done (or failed: ``receipt.failed``). Its reads, when known, go to its
    part of the record, written first; the receipt names the part."""
    if receipt.reads is not None:
        part = write_part(store, receipt.step, receipt.rank, merged(receipt.reads), receipt.algorithm)
        receipt = dataclasses.replace(receipt, reads=None, part=part)
    store.put_bytes(layout.receipt_path(receipt.step, receipt.rank, receipt.attempt), receipt.to_json())


# ------------------------------------------------------------------------------ 2.-5. rank 0
def commit(store: Store, step: int, *, world_size: int, attempt: str, algorithm: str, config_digest: str,
           saved_at: str, committed_by: str, retry: Retry, stop: threading.Event,
           poll_interval: float) -> Manifest | None:
    """Commit step N once every rank's receipt is in (rank 0 only).

    Returns the commit record written, or None if someone else committed the step meanwhile.
    Raises StorageError (one line) when the step stays incomplete: a rank failed, a file is
    missing or has the wrong size, or ``stop`` was set while waiting."""
    receipts = wait_for_receipts(store, step, world_size, attempt, retry, stop, poll_interval)
    files = checked_files(receipts, step)
    parts = _parts(receipts, step)
    data_dir = layout.attempt_dir(attempt)
    # the folders the record will name, not the step's: what other attempts left there is never listed
    folders = [layout.data_key(step, data_dir, "").rstrip("/")] + ([layout.parts_dir(step)] if parts else [])
    listing = [e for folder in folders for e in retry(f"listing {folder}", functools.partial(store.find, folder))]
    check_sizes(store, step, data_dir, files, listing, parts or [])
    manifest = Manifest(
        step=step, world_size=world_size, files=files, algorithm=algorithm,
        config_digest=config_digest, attempt=attempt,
        saved_at=receipts[0].saved_at or saved_at, committed_at=utc_iso(),
        extra={"committed_by": committed_by}, parts=parts,
        gathered=gather_spans(store, step, data_dir, files, algorithm, retry), data_dir=data_dir,
    )
    # Built once, from receipts each checked when parsed (paths, sizes, block counts) and by
    # checked_files (no file twice): no round trip through the parser.
    index = manifest.to_json()
    if len(index) > INDEX_MAX_BYTES:
        raise StorageError(f"{store.url(layout.commit_path(step))}: the commit record's index would be "
                           f"{len(index) / 2**20:.0f} MiB, above the {INDEX_MAX_BYTES >> 20} MiB that one "
                           f"create-only PUT may hold; step {step} stays incomplete")
    path = layout.commit_path(step)
    retry("writing the commit record", lambda: store.exists(path) or store.create_bytes(path, index))
    # The record there decides, not what the PUT answered: a store that ignores If-None-Match (rclone's
    # `serve s3`, on PUT and on multipart complete alike) lets a second committer replace the first's, and a
    # retried PUT may find its own first try. Two committers racing within one PUT's time on such a store
    # can still both see their own: only a store with conditional writes makes the record create-only.
    if retry("reading the commit record back", lambda: store.cat(path)) != index:
        log.warning("checkpoint step %d was committed by someone else meanwhile; keeping theirs", step)
        return None
    entry = layout.catalog_entry(step, world_size, len(files), manifest.total_bytes)
    retry("writing the catalog entry", lambda: store.put_bytes(entry, b'{"step": %d}\n' % step))
    log.info("checkpoint step %d committed: %d file(s), %.1f MiB at %s", step, len(files),
             manifest.total_bytes / 2**20, store.url(layout.step_dir(step)))
    return manifest


def wait_for_receipts(store: Store, step: int, world_size: int, attempt: str, retry: Retry,
                      stop: threading.Event, poll_interval: float) -> list[Receipt]:
    """Poll until all ``world_size`` receipts of this attempt are there; StorageError if ``stop`` is set."""
    delay = min(0.2, poll_interval)
    waited_since, last_log = time.monotonic(), time.monotonic()
    poll = ReceiptPoll(store, step, world_size, attempt)
    while True:
        receipts = retry("reading receipts", poll.gather)
        if receipts is not None:
            return receipts
        if stop.wait(delay):
            raise StorageError("given up at close while waiting for the other ranks' uploads")
        delay = min(delay * 1.5, poll_interval)
        if time.monotonic() - last_log > 300:
            log.info("checkpoint step %d: still waiting for the other ranks' uploads (%.0f s)", step,
                     time.monotonic() - waited_since)
            last_log = time.monotonic()


class ReceiptPoll:
    """The receipts of one step as the committer polls for them. Each :meth:`gather` lists the receipt
    folder and reads only the receipts that are new or changed since they were read (by their listing's
    size and time), so that a poll costs one listing and what changed, whatever the number of ranks whose
    receipts are in, or that an earlier attempt left."""

    def __init__(self, store: Store, step: int, world_size: int, attempt: str) -> None:
        self.store, self.step, self.world_size, self.attempt = store, step, world_size, attempt
        self.read: dict[str, tuple[tuple[int, float | None], Receipt]] = {}
        """Per receipt path: the listing's (size, time) when it was read, and what it said."""

    def _current(self, r: Receipt) -> bool:
        return r.step == self.step and (not self.attempt or r.attempt == self.attempt)

    def _stale(self, path: str, version: tuple[int, float | None]) -> bool:
        """Whether the receipt at ``path`` must be read (again): never read, changed, or one of another attempt
        on a store whose listing has no times (it cannot say whether it changed)."""
        got = self.read.get(path)
        return got is None or got[0] != version or (version[1] is None and not self._current(got[1]))

    def gather(self) -> list[Receipt] | None:
        """All ``world_size`` receipts of this attempt, or None while some are still missing."""
        entries = self.store.ls(layout.receipt_dir(self.step, self.attempt))
        listed = {e.name: (e.size, e.mtime) for e in entries}
        wanted = [layout.receipt_path(self.step, r, self.attempt) for r in range(self.world_size)]
        if any(p.rsplit("/", 1)[-1] not in listed for p in wanted):
            return None
        extra = [e.path for e in entries if (layout.parse_receipt_name(e.name) or 0) >= self.world_size]
        if extra:  # left by a writer without an attempt id, with more ranks, in the folder they share
            self.store.rm_files(extra)
        versions = {p: listed[p.rsplit("/", 1)[-1]] for p in wanted}
        todo = [p for p in wanted if self._stale(p, versions[p])]
        for path, blob in self.store.cat_many(todo).items():
            if blob is None:  # deleted since the listing
                self.read.pop(path, None)
            else:
                self.read[path] = (versions[path], Receipt.from_json(blob, where=self.store.url(path)))
        receipts = [self.read[p][1] for p in wanted if p in self.read]
        if len(receipts) < len(wanted) or not all(self._current(r) for r in receipts):
            return None  # (writers without an attempt id) an earlier one's receipt: this rank will overwrite it
        return receipts


def gather_spans(store: Store, step: int, data_dir: str, files: list[FileEntry], algorithm: str,
                 retry: Retry) -> GatheredRef | None:
    """Every file's spans, read from the store once per checkpoint (a file's nearby spans with one ranged GET:
    :mod:`.storage.range_batches`) and checked against the checksums their ranks recorded, written as one
    object (create-only, its name unique to this committer);
    None when no file has spans or they hold more than GATHERED_MAX_BYTES. StorageError for a span whose
    bytes differ (a file changed after its rank hashed it): the step stays incomplete."""
    items = gathered_layout(files)
    if not items or sum(n for _, _, n, _ in items) > GATHERED_MAX_BYTES:
        return None
    ranges = [(layout.data_key(step, data_dir, path), off, n) for path, off, n, _ in items]
    got = retry("reading the files' small items", lambda: store.read_ranges(ranges))
    for (rel, off, n), (_, _, _, checksum), data in zip(ranges, items, got):
        if hash_bytes(data, algorithm) != checksum:
            raise StorageError(f"{store.url(rel)}: bytes {off}-{off + n} differ from what their rank recorded; "
                               f"step {step} stays incomplete")
    blob = b"".join(got)
    ref = GatheredRef(layout.spans_name(secrets.token_hex(8)), len(blob), hash_bytes(blob, algorithm))
    path = layout.spans_path(step, ref.name)
    retry("writing the gathered small items", lambda: store.exists(path) or store.create_bytes(path, blob))
    return ref


def checked_files(receipts: list[Receipt], step: int) -> list[FileEntry]:
    """Every rank's files; StorageError if a rank failed or two ranks uploaded the same file."""
    failed = [r for r in receipts if r.failed]
    if failed:
        raise StorageError(f"rank {failed[0].rank} could not upload: {failed[0].failed}; step {step} "
                           f"stays incomplete")
    files = [f for r in receipts for f in r.files]
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise StorageError(f"file {f.path} was uploaded by two ranks; step {step} stays incomplete")
        seen.add(f.path)
    return files


def check_sizes(store: Store, step: int, data_dir: str, files: list[FileEntry], listing: list[Entry],
                parts: list[PartRef]) -> None:
    """StorageError unless each file (in ``data_dir``) and part is in ``listing`` (of those folders) with its
    receipt's size."""
    sizes = {e.path: e.size for e in listing}
    wanted = [(layout.data_key(step, data_dir, f.path), f.size) for f in files]
    wanted += [(layout.part_path(step, p.name), p.size) for p in parts]
    for path, size in wanted:
        got = sizes.get(path)
        if got != size:
            raise StorageError(f"{store.url(path)}: store has {'no such file' if got is None else f'{got} bytes'}, "
                               f"expected {size}; step {step} stays incomplete")


def _parts(receipts: list[Receipt], step: int) -> list[PartRef] | None:
    """Every rank's part, in rank order, when every receipt names one; else None."""
    missing = [r.rank for r in receipts if r.part is None]
    if missing:
        if len(missing) < len(receipts):
            log.warning("checkpoint step %d: ranks %s sent no read map: every node will fetch all of it", step,
                        missing[:8])
        return None
    return [r.part for r in receipts if r.part is not None]


# ------------------------------------------------------------------------------ deleting
def delete_checkpoint(store: Store, info: CheckpointInfo) -> None:
    """Delete one checkpoint: catalog entries, then the commit record, then the folder."""
    store.rm_files(list(info.catalog_entries))
    store.rm_files([layout.commit_path(info.step)])
    store.rm_tree(layout.step_dir(info.step))
