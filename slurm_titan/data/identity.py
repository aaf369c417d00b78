"""A dataset's fingerprint, kept in the data loader's checkpoint state and checked on resume (torch-free).

The fingerprint is what the checkpoint's sample cursor means something against: the dataset's
name and path, its row count, the bytes of its local files (when it is a local file or folder),
and a SHA-256 of its first rows' text (the head); a token-shard dataset gives its manifest's sizes and
content digest in their place (:func:`content_fingerprint`). Content decides: the same files at another path
are the same dataset (the log says the path moved); another row count, size or head is another
dataset (a stream, with no content to compare, is identified by its path), and resuming on it is refused
unless ``checkpoint.allow_dataset_change`` is true.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

HEAD_ROWS = 64
"""Rows whose text the head hash covers."""

_COMPARED = ("kind", "rows", "bytes", "head_sha256")


def local_bytes(path: str | None) -> int | None:
    """Total size of a local dataset file or folder (every file below it), None when it is not local."""
    if not path or not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files if not f.startswith("."))
    return total


def head_sha256(texts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def fingerprint(name: str, path: str | None, kind: str, rows: int | None, head: Iterable[str] | None) -> dict[str, Any]:
    """The dataset's identity: ``kind`` is "map-style" or "streaming"; ``rows`` and ``head`` (the first
    HEAD_ROWS texts) where the dataset can give them without reading it all."""
    return content_fingerprint(name, path, kind, rows, local_bytes(path), None if head is None else head_sha256(head))


def content_fingerprint(name: str, path: str | None, kind: str, rows: int | None, size: int | None,
                        digest: str | None) -> dict[str, Any]:
    """The identity of a dataset that knows its own size and content digest (a token-shard manifest's)."""
    return {"name": name, "path": os.path.abspath(path) if path and os.path.exists(path) else path, "kind": kind,
            "rows": rows, "bytes": size, "head_sha256": digest}


def difference(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """What makes ``current`` another dataset than ``saved`` (one phrase), or None when it is the same.
    Without content to compare (a stream), the path decides."""
    changed = [f"{key} {saved.get(key)} -> {current.get(key)}" for key in _COMPARED
               if saved.get(key) != current.get(key)]
    blind = all(saved.get(key) is None for key in _COMPARED[1:])
    if saved.get("path") != current.get("path") and (blind or saved.get("name") != current.get("name")):
        changed.insert(0, f"path {saved.get('path')} -> {current.get('path')}")
    return ", ".join(changed) or None
