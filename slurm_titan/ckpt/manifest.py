"""The commit record (manifest) of a checkpoint and the per-rank upload receipt, as JSON.

Every path in a record is relative to its step folder; a record holding an absolute path,
a ``..`` component, an empty component or a backslash is refused, so a corrupt or hostile
record can never make ``restore`` write outside its destination. Records carry no storage
location and no credentials.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from slurm_titan.errors import StorageError

from . import layout

FORMAT = "slurm-titan-checkpoint/1"
RECEIPT_FORMAT = "slurm-titan-receipt/1"


class ManifestError(StorageError):
    """A commit record or receipt is malformed or names a path outside its step folder."""


def check_relpath(path: object, where: str = "record") -> str:
    """Return ``path`` if it is a safe relative path inside a step folder, else raise."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{where}: file path {path!r} is not a non-empty string")
    bad = None
    if path.startswith(("/", "~")):
        bad = "is absolute"
    elif "\\" in path or "\x00" in path:
        bad = "contains a backslash or NUL"
    elif len(path) > 1 and path[1] == ":":
        bad = "looks like a drive path"
    else:
        parts = path.split("/")
        if any(p == ".." for p in parts):
            bad = "contains '..'"
        elif any(p in ("", ".") for p in parts):
            bad = "has an empty or '.' component"
        elif layout.is_meta(path):
            bad = f"is inside the reserved {layout.META_DIR}/ folder"
    if bad:
        raise ManifestError(f"{where}: refusing file path {path!r}: it {bad} (outside its step folder)")
    return path


def utc_iso(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def config_digest(config: Any) -> str:
    """A stable digest of a training config (any JSON-serialisable object)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    checksum: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "checksum": self.checksum}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> FileEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: file entry is not an object")
        path = check_relpath(d.get("path"), where)
        size, checksum = d.get("size"), d.get("checksum")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where}: {path}: bad size {size!r}")
        if not isinstance(checksum, str) or not checksum:
            raise ManifestError(f"{where}: {path}: bad checksum {checksum!r}")
        return cls(path, size, checksum)


def _files_from(raw: Any, where: str) -> list[FileEntry]:
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: 'files' is not a list")
    files = [FileEntry.from_dict(d, where) for d in raw]
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise ManifestError(f"{where}: file {f.path!r} is listed twice")
        seen.add(f.path)
    return files


def _load_json(data: bytes, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: not a JSON object")
    return obj


def _int_field(obj: dict[str, Any], key: str, where: str, minimum: int = 0) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ManifestError(f"{where}: bad {key!r}: {v!r}")
    return v


@dataclass
class Manifest:
    """The commit record: a checkpoint is complete exactly when this exists in its step folder."""

    step: int
    world_size: int
    files: list[FileEntry]
    algorithm: str
    config_digest: str = ""
    attempt: str = ""
    saved_at: str = ""
    committed_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "config_digest": self.config_digest,
            "attempt": self.attempt,
            "saved_at": self.saved_at,
            "committed_at": self.committed_at,
            "checksum_algorithm": self.algorithm,
            "total_bytes": self.total_bytes,
            "files": [f.to_dict() for f in sorted(self.files, key=lambda f: f.path)],
            "extra": self.extra,
        }
        return (json.dumps(body, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "commit record", step: int | None = None) -> Manifest:
        obj = _load_json(data, where)
        if obj.get("format") != FORMAT:
            raise ManifestError(f"{where}: unknown format {obj.get('format')!r}")
        m = cls(
            step=_int_field(obj, "step", where),
            world_size=_int_field(obj, "world_size", where, minimum=1),
            files=_files_from(obj.get("files"), where),
            algorithm=str(obj.get("checksum_algorithm") or ""),
            config_digest=str(obj.get("config_digest") or ""),
            attempt=str(obj.get("attempt") or ""),
            saved_at=str(obj.get("saved_at") or ""),
            committed_at=str(obj.get("committed_at") or ""),
            extra=obj.get("extra") if isinstance(obj.get("extra"), dict) else {},
        )
        if not m.algorithm:
            raise ManifestError(f"{where}: no checksum_algorithm")
        if step is not None and m.step != step:
            raise ManifestError(f"{where}: records step {m.step}, expected {step}")
        return m


@dataclass
class Receipt:
    """What one rank uploaded for one step (or why it gave up on that step)."""

    step: int
    rank: int
    world_size: int
    attempt: str
    files: list[FileEntry]
    algorithm: str
    uploaded_at: str = ""
    saved_at: str = ""
    failed: str = ""

    def to_json(self) -> bytes:
        body = {
            "format": RECEIPT_FORMAT,
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world_size,
            "attempt": self.attempt,
            "checksum_algorithm": self.algorithm,
            "uploaded_at": self.uploaded_at,
            "saved_at": self.saved_at,
            "failed": self.failed,
            "files": [f.to_dict() for f in self.files],
        }
        return (json.dumps(body) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "receipt") -> Receipt:
        obj = _load_json(data, where)
        if obj.get("format") != RECEIPT_FORMAT:
            raise ManifestError(f"{where}: unknown format {obj.get('format')!r}")
        return cls(
            step=_int_field(obj, "step", where),
            rank=_int_field(obj, "rank", where),
            world_size=_int_field(obj, "world_size", where, minimum=1),
            attempt=str(obj.get("attempt") or ""),
            files=_files_from(obj.get("files"), where),
            algorithm=str(obj.get("checksum_algorithm") or ""),
            uploaded_at=str(obj.get("uploaded_at") or ""),
            saved_at=str(obj.get("saved_at") or ""),
            failed=str(obj.get("failed") or ""),
        )
