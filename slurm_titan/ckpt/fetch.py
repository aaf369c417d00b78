"""The fetcher: executes a :class:`.fetch_plan.FetchPlan` into a local folder, and checks a local copy against one.

Every byte is checked against the commit record as it arrives: files fetched whole against their
checksum (the bad blocks named when it fails), pieces of files against their own. Files whole go in
one batch (:meth:`.storage.Store.download_many`), pieces as ranged reads into sparse files
(:meth:`.storage.Store.download_pieces`), and the pieces the record's gathered object holds with one
GET of it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import check_listing
from slurm_titan.ckpt.checksum import hash_bytes, hash_file
from slurm_titan.ckpt.fetch_plan import FetchPlan, Piece
from slurm_titan.ckpt.manifest import FileEntry, Manifest
from slurm_titan.ckpt.share import SHARE_FILE, Share, describe_ranges
from slurm_titan.ckpt.storage import Store
from slurm_titan.errors import StorageError

log = logging.getLogger("slurm_titan.ckpt.fetch")


class CorruptCheckpoint(StorageError):
    """A committed checkpoint whose files are missing, truncated or fail their checksum."""

    def __init__(self, message: str, bad: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.bad = bad


def check_present(store: Store, m: Manifest) -> None:
    """Raises CorruptCheckpoint when a file of the record is missing from the location or of another size (one
    listing of the step's folder)."""
    bad = check_listing(store, m)
    if bad:
        raise CorruptCheckpoint(_describe_bad(store, m.step, bad), bad)


def download(store: Store, plan: FetchPlan, folder: str,
             progress: Callable[[int], None] | None) -> list[tuple[str, int, int]]:
    """Fetch what ``plan`` says into ``folder``, verifying every file and piece; returns the pieces (path, offset,
    length) that came from the record's gathered object. Raises CorruptCheckpoint naming what is bad."""
    items: list[tuple[str, str, int | None]] = [
        (plan.source(f.path), _inside(folder, f.path), f.size) for f in plan.whole]
    results = store.download_many(items, progress, plan.algorithm)
    bad = [(f.path, why) for f, (size, digest) in zip(plan.whole, results)
           if (why := _download_problem(_inside(folder, f.path), f, size, digest, plan.algorithm))]
    gathered = _gathered_spans(store, plan)
    parts = [(plan.source(f.path), _inside(folder, f.path), f.size,
              [p for p in pieces if (f.path, p[0], p[1]) not in gathered]) for f, pieces in plan.pieces]
    for (f, _), failed in zip(plan.pieces, store.download_pieces(parts, plan.algorithm, progress)):
        if failed:
            bad.append((f.path, describe_ranges(f, failed)))
    _write_spans(folder, gathered, progress)
    if bad:
        raise CorruptCheckpoint(_describe_bad(store, plan.step, bad), bad)
    return list(gathered)


def intact(folder: str, plan: FetchPlan) -> bool:
    """Whether ``folder`` holds an intact copy of at least what ``plan`` fetches."""
    m, share = plan.manifest, plan.share
    try:
        with open(os.path.join(folder, layout.COMMIT_RECORD), "rb") as record:
            raw = record.read()
        # the record as fetched (restores since format 2), or one re-written by an older restore: parsed
        local = m if raw == m.raw else Manifest.from_json(raw, step=m.step)
        held = read_share(folder, m)
    except (OSError, StorageError):
        return False
    if {(f.path, f.size, f.checksum) for f in local.files} != {(f.path, f.size, f.checksum) for f in m.files}:
        return False
    if share is not None and held is not None and held.world_size != share.world_size:
        return False  # the share of other ranks' loads: fetched anew
    files: list[tuple[FileEntry, tuple[Piece, ...] | None]] = [(f, None) for f in plan.whole]  # None: whole
    for f, pieces in files + list(plan.pieces):
        p = _inside(folder, f.path)
        try:
            if os.path.getsize(p) != f.size:
                return False
            if pieces is None:
                ok = (held is None or f.path in held.whole) and hash_file(p, m.algorithm) == (f.size, f.checksum)
            else:
                ok = (held is None or f.path in held.whole or set(pieces) <= set(held.pieces(f))) and _pieces_ok(
                    p, pieces, m.algorithm)
        except OSError:
            return False
        if not ok:
            return False
    return True


def read_share(folder: str, m: Manifest) -> Share | None:
    """What of a checkpoint a restored step folder holds (its share record; None: all of it)."""
    path = os.path.join(folder, layout.META_DIR, SHARE_FILE)
    try:
        with open(path, "rb") as f:
            share = Share.from_json(f.read(), path)
    except FileNotFoundError:
        return None
    share = share if share.files else share.with_files(m)
    return share if share.world_size is not None else dataclasses.replace(share, world_size=m.world_size)


def _gathered_spans(store: Store, plan: FetchPlan) -> dict[tuple[str, int, int], bytes]:
    """The pieces of ``plan`` that the record's gathered object holds (:attr:`.FetchPlan.gathered`), with their
    bytes, from one GET of it. An object missing or damaged is said in one line, and its pieces are fetched
    from their files instead."""
    m, ref = plan.manifest, plan.manifest.gathered
    if ref is None or not plan.gathered:
        return {}
    rel = layout.spans_path(m.step, ref.name)
    try:
        blob = store.cat(rel)
    except FileNotFoundError:
        blob = b""
    if len(blob) != ref.size or hash_bytes(blob, m.algorithm) != ref.checksum:
        log.warning("checkpoint step %d: %s is missing or damaged: its small items are fetched from their files",
                    m.step, store.url(rel))
        return {}
    return {(path, off, n): blob[at:at + n] for path, off, n, at in plan.gathered}


def _write_spans(folder: str, spans: dict[tuple[str, int, int], bytes],
                 progress: Callable[[int], None] | None) -> None:
    """Write gathered spans at their offsets into the (sparse) files under ``folder`` that hold them."""
    for (path, off, _), data in sorted(spans.items()):
        try:
            fd = os.open(_inside(folder, path), os.O_WRONLY)
            try:
                os.pwrite(fd, data, off)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"cannot write {_inside(folder, path)}: {e.strerror}") from None
        if progress:
            progress(len(data))


def _download_problem(path: str, f: FileEntry, size: int, digest: str, algorithm: str) -> str:
    """Why a downloaded file (``size`` bytes read, checksum ``digest``) is bad; "" when it is not."""
    if size != f.size:
        return f"truncated: read {size} bytes, expected {f.size}"
    return _bad_blocks(path, f, algorithm) if digest != f.checksum else ""


def _bad_blocks(path: str, f: FileEntry, algorithm: str) -> str:
    """Which byte ranges of a downloaded file that failed its checksum are bad (from its block
    checksums; only the whole file's in records without them)."""
    if not f.block_size:
        return "checksum mismatch"
    with open(path, "rb", buffering=0) as fin:
        bad = [b for b in range(len(f.blocks))
               if hash_bytes(os.pread(fin.fileno(), f.block_span(b)[1], f.block_span(b)[0]), algorithm) != f.blocks[b]]
    if not bad:
        return "checksum mismatch (though every block matches its own: the record disagrees with itself)"
    return describe_ranges(f, [f.block_span(b) for b in bad])


def _pieces_ok(path: str, pieces: tuple[Piece, ...], algorithm: str) -> bool:
    with open(path, "rb", buffering=0) as fin:
        return all(hash_bytes(os.pread(fin.fileno(), n, off), algorithm) == c for off, n, c in pieces)


def _describe_bad(store: Store, step: int, bad: list[tuple[str, str]]) -> str:
    head = ", ".join(f"{p}: {why}" for p, why in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return f"{store.url(layout.step_dir(step))}: {len(bad)} bad file(s): {head}{more}"


def _inside(base: str, rel: str) -> str:
    path = os.path.normpath(os.path.join(base, rel))
    if os.path.commonpath([base, path]) != base:
        raise StorageError(f"refusing to write {rel!r} outside {base}")
    return path
