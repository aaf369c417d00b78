"""What a checkpoint location holds: list, show, verify (:mod:`.restore` restores).

``list_checkpoints`` takes a constant number of LIST requests however many checkpoints the
location holds: one listing of the root (the ``step-N/`` folders) and one of the catalog
(entries whose names carry each committed checkpoint's world size, file count and bytes).
Only a step folder without a catalog entry (an upload in progress or interrupted, a plain
torchtitan folder, or one made by ``restore``) costs one more listing of that folder, and one
read of its commit record if it has one.

A checkpoint is complete only if its commit record exists (:mod:`.commit`): a catalog entry is
written after the record and deleted before it, so an entry stands for a record.
"""

from __future__ import annotations

import calendar
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.checksum import hash_bytes
from slurm_titan.ckpt.manifest import FileEntry, GatheredRef, Manifest
from slurm_titan.ckpt.share import SHARE_FILE, Share, describe_ranges
from slurm_titan.ckpt.storage import Store
from slurm_titan.errors import StorageError

log = logging.getLogger("slurm_titan.ckpt.catalog")

ByteProgress = Callable[[int, int], None]
"""progress(done_bytes, total_bytes)."""


@dataclass
class CheckpointInfo:
    step: int
    complete: bool
    time: float | None
    """Commit time (complete) or time of the newest file (incomplete), Unix seconds."""
    size: int | None
    """Bytes of checkpoint data (receipts and records not counted)."""
    files: int | None
    world_size: int | None
    where: str
    detail: str = ""
    catalog_entries: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "complete" if self.complete else "incomplete"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "complete": self.complete,
            "time": None if self.time is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)),
            "size": self.size,
            "files": self.files,
            "world_size": self.world_size,
            "where": self.where,
            "detail": self.detail,
        }


def list_checkpoints(store: Store) -> list[CheckpointInfo]:
    """Every checkpoint of the location, oldest first."""
    top = store.ls("")
    step_dirs = {}
    has_meta = False
    for e in top:
        if not e.is_dir:
            continue
        s = layout.parse_step_dir(e.name)
        if s is not None:
            step_dirs[s] = e
        elif e.name == layout.META_DIR:
            has_meta = True
    catalog: dict[int, tuple[tuple[int, int, int, int], float | None, list[str]]] = {}
    if has_meta:
        for e in store.ls(layout.CATALOG_DIR):
            parsed = layout.parse_catalog_entry(e.name)
            if parsed is None:
                continue
            step = parsed[0]
            prev = catalog.get(step)
            names = (prev[2] if prev else []) + [e.path]
            if prev is None or (e.mtime or 0) >= (prev[1] or 0):
                catalog[step] = (parsed, e.mtime, names)
            else:
                catalog[step] = (prev[0], prev[1], names)
    out = []
    for step in sorted(step_dirs):
        where = store.url(layout.step_dir(step))
        if step in catalog:
            (_, ws, nfiles, nbytes), mtime, names = catalog[step]
            out.append(CheckpointInfo(step, True, mtime, nbytes, nfiles, ws, where, catalog_entries=names))
            continue
        info = _inspect_step(store, step, where)
        if info is not None:
            out.append(info)
    return out


def _inspect_step(store: Store, step: int, where: str) -> CheckpointInfo | None:
    """One listing of a step folder that has no catalog entry (None if it holds no file)."""
    prefix = layout.step_dir(step) + "/"
    entries = store.find(layout.step_dir(step))
    if not entries:
        return None
    data = [e for e in entries if not layout.is_meta(e.path[len(prefix):])]
    meta = [e for e in entries if layout.is_meta(e.path[len(prefix):])]
    commit = next((e for e in meta if e.path == layout.commit_path(step)), None)
    receipts = [e for e in meta if e.path.startswith(layout.receipt_dir(step, "") + "/")]
    newest = max((e.mtime or 0 for e in entries), default=0) or None
    size = sum(e.size for e in data)
    if commit is not None:
        world_size, committed = _commit_facts(store, step)
        return CheckpointInfo(step, True, committed or commit.mtime, size, len(data), world_size, where,
                              detail="no catalog entry")
    if receipts:
        detail = f"{len(receipts)} rank receipt(s); upload in progress or interrupted"
    elif any(e.path == prefix + layout.DCP_METADATA for e in data):
        detail = "torchtitan checkpoint without a commit record"
    else:
        detail = "no commit record"
    return CheckpointInfo(step, False, newest, size, len(data), None, where, detail=detail)


def _commit_facts(store: Store, step: int) -> tuple[int | None, float | None]:
    """World size and commit time from a step's commit record: a folder made by ``restore`` has the
    record but neither receipts nor catalog, and its files' times are the restore's.
    (None, None) if the record is unreadable (``verify``/``restore`` then say why)."""
    try:
        m = read_manifest(store, step)
    except StorageError as e:
        log.warning("%s", e)
        return None, None
    try:
        committed = float(calendar.timegm(time.strptime(m.committed_at, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        committed = None
    return m.world_size, committed


def newest_complete(infos: list[CheckpointInfo]) -> CheckpointInfo | None:
    done = [i for i in infos if i.complete]
    return max(done, key=lambda i: i.step) if done else None


def read_manifest(store: Store, step: int) -> Manifest:
    """The commit record of ``step`` (StorageError if there is none or it is malformed)."""
    path = layout.commit_path(step)
    try:
        blob = store.cat(path)
    except FileNotFoundError:
        raise StorageError(f"{store.url(layout.step_dir(step))}: no commit record: checkpoint step {step} "
                           f"is incomplete or does not exist") from None
    return Manifest.from_json(blob, where=store.url(path), step=step)


def _pick_step(store: Store, step: int | None, infos: list[CheckpointInfo] | None = None) -> int:
    if step is not None:
        return step
    infos = list_checkpoints(store) if infos is None else infos
    newest = newest_complete(infos)
    if newest is None:
        raise StorageError(f"{store.location}: no complete checkpoint")
    return newest.step


def check_listing(store: Store, m: Manifest) -> list[tuple[str, str]]:
    """Missing or wrongly sized files of a checkpoint (the objects its record names), from one listing of the folder
    they are in (not the step's: what other attempts left there is never listed)."""
    sizes = {e.path: e.size for e in store.find(m.key("").rstrip("/"))}
    bad = []
    for f in m.files:
        got = sizes.get(m.key(f.path))
        if got is None:
            bad.append((f.path, "missing"))
        elif got != f.size:
            kind = "truncated" if got < f.size else "too large"
            bad.append((f.path, f"{kind}: {got} bytes, expected {f.size}"))
    return bad


@dataclass
class VerifyReport:
    step: int
    files: int
    bytes: int
    bad: list[tuple[str, str]]
    where: str
    share: list[int] | None = None
    """The ranks whose share the folder holds (a node's restore, ``ckpt restore --ranks``); None: all of it."""

    @property
    def ok(self) -> bool:
        return not self.bad


def verify(store: Store, step: int | None = None, progress: ByteProgress | None = None) -> VerifyReport:
    """Recompute every checksum of a committed checkpoint (default: the newest complete one).

    The report names each bad file: missing, truncated, or a checksum mismatch. A restored folder that holds
    one node's share (its ``share.json``) is verified for what it holds: its whole files by their checksums,
    its pieces of the others by their block checksums; what is outside the share is not reported missing."""
    step = _pick_step(store, step)
    m = read_manifest(store, step)
    share = _held_share(store, step)
    held = [f for f in m.files if share is None or f.path in share.whole or share.pieces(f)]
    held_paths = {f.path for f in held}
    bad = [(path, why) for path, why in check_listing(store, m) if path in held_paths]
    names_bad = {p for p, _ in bad}
    todo = [f for f in held if f.path not in names_bad and (share is None or f.path in share.whole)]
    counter = ByteCounter(m.total_bytes if share is None else share.nbytes(m), progress)
    results = store.checksum_many([(m.key(f.path), f.size) for f in todo], m.algorithm,
                                  counter.add)
    for f, r in zip(todo, results):
        if isinstance(r, BaseException):
            bad.append((f.path, f"cannot read: {r}"))
        elif r[0] != f.size:
            bad.append((f.path, f"truncated: read {r[0]} bytes, expected {f.size}"))
        elif r[1] != f.checksum:
            bad.append((f.path, f"checksum mismatch ({m.algorithm} {r[1][:12]}..., expected {f.checksum[:12]}...)"))
    if share is not None:
        for f in held:
            if f.path not in names_bad and f.path not in share.whole:
                bad += [(f.path, why) for why in [_bad_pieces(store, m, f, share, counter)] if why]
    elif m.gathered is not None:
        bad += _bad_gathered(store, m, m.gathered)
    return VerifyReport(step, len(held), m.total_bytes if share is None else share.nbytes(m), sorted(bad),
                        store.url(layout.step_dir(step)), None if share is None else share.ranks)


def _bad_gathered(store: Store, m: Manifest, ref: GatheredRef) -> list[tuple[str, str]]:
    """The record's gathered small items, when damaged. Absent is not bad: a restored folder does not hold them,
    and a restore without them reads each item from its file."""
    rel = layout.spans_path(m.step, ref.name)
    try:
        blob = store.cat(rel)
    except FileNotFoundError:
        return []
    if len(blob) == ref.size and hash_bytes(blob, m.algorithm) == ref.checksum:
        return []
    return [(rel.split("/", 1)[1], f"gathered small items damaged ({len(blob)} bytes, expected {ref.size}, or "
                                   f"a checksum mismatch)")]


def _held_share(store: Store, step: int) -> Share | None:
    """The share a restored folder holds of `step` (its share.json), None when it holds all of it."""
    rel = f"{layout.step_dir(step)}/{layout.META_DIR}/{SHARE_FILE}"
    if not store.exists(rel):
        return None
    return Share.from_json(store.cat(rel), store.url(rel))


def _bad_pieces(store: Store, m: Manifest, f: FileEntry, share: Share, counter: ByteCounter) -> str:
    """Which of the share's pieces of `f` fail their block checksums ("" when none). Shares are only ever
    restored into local folders, so the pieces are read in place."""
    failed = []
    with open(store.full(m.key(f.path)), "rb", buffering=0) as fin:
        for off, n, checksum in share.pieces(f):
            if hash_bytes(os.pread(fin.fileno(), n, off), m.algorithm) != checksum:
                failed.append((off, n))
            counter.add(n)
    return describe_ranges(f, failed) if failed else ""


class ByteCounter:
    """Adds up the bytes of concurrent transfers for one ``progress`` callback."""

    def __init__(self, total: int, progress: ByteProgress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress
        self.lock = threading.Lock()
        if progress:
            progress(0, total)

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            done = self.done
        if self.progress:
            self.progress(done, self.total)
