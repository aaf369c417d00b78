"""The commit record (manifest) of a checkpoint and the per-rank upload receipt, as JSON.

Format 2 (written since 4,096-rank saves: records of O(N x items) took minutes to write and were
parsed by every process) is an *index*, O(files + ranks) and compact: each file's size, checksum and
block checksums (one string per file), the checksums of the few small items other ranks read
(replicated ones), those items gathered into one object (:class:`GatheredRef`), and one :class:`PartRef`
per rank naming that rank's part (its read map, :mod:`.parts`) with its size and checksum. The index is the
commit point. Format 1 (the read map inline, block checksums as lists) is still read.

Every path in a record is relative to its step folder; a record holding an absolute path,
a ``..`` component, an empty component or a backslash is refused, so a corrupt or hostile
record can never make ``restore`` write outside its destination. Records carry no storage
location and no credentials.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.checksum import BlockHasher
from slurm_titan.errors import StorageError

FORMAT = "slurm-titan-checkpoint/2"
FORMAT_1 = "slurm-titan-checkpoint/1"
RECEIPT_FORMAT = "slurm-titan-receipt/1"
INDEX_MAX_BYTES = 64 << 20
"""The most a commit record's index may hold: below s3fs's single-PUT limit (100 MiB; a multipart upload
above it carries If-None-Match only on its complete, which not every store honours), so the commit point
is one conditional PUT. An index of 16,384 ranks of a 70B model with AdamW is about 5 MiB."""


def compact_json(obj: Any) -> bytes:
    """``obj`` as one line of JSON without whitespace (CPython's C encoder; ``indent`` is pure Python)."""
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


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


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size and checksum and, in records written since block
    checksums exist, one checksum per ``block_size`` bytes (older records: none, and such a file
    can only be fetched and verified whole)."""

    path: str
    size: int
    checksum: str
    block_size: int = 0
    blocks: tuple[str, ...] = ()
    spans: tuple[tuple[int, int, str], ...] = ()
    """(offset, length, checksum) of small DCP items that other ranks read (a few bytes to a few
    KiB at the head and tail of a file): fetched and verified exactly, not by whole blocks."""

    def to_dict(self, blocks_listed: bool = False) -> dict[str, Any]:
        """As JSON: the block checksums as one string (each as long as ``checksum``), or as a list
        (``blocks_listed``: format 1's shape, what ``ckpt show --json`` prints)."""
        d: dict[str, Any] = {"path": self.path, "size": self.size, "checksum": self.checksum}
        if self.block_size:
            d.update(block_size=self.block_size, blocks=list(self.blocks) if blocks_listed else "".join(self.blocks))
        if self.spans:
            d["spans"] = [list(s) for s in self.spans]
        return d

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
        block_size, blocks = d.get("block_size", 0), d.get("blocks", [])
        spans = _spans_from(d.get("spans", []), path, size, where)
        if "block_size" not in d and "blocks" not in d:
            return cls(path, size, checksum, spans=spans)
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0 or block_size % 4096:
            raise ManifestError(f"{where}: {path}: bad block_size {block_size!r} (a positive multiple of 4096)")
        if isinstance(blocks, str) and len(blocks) % len(checksum) == 0:  # format 2: one string, as in to_dict
            blocks = [blocks[i:i + len(checksum)] for i in range(0, len(blocks), len(checksum))]
        if not isinstance(blocks, list) or not all(isinstance(b, str) and b for b in blocks):
            raise ManifestError(f"{where}: {path}: 'blocks' is not a list of checksums")
        expected = -(-size // block_size)
        if len(blocks) != expected:
            raise ManifestError(f"{where}: {path}: bytes 0-{size}: {len(blocks)} block checksum(s) for {size} "
                                f"bytes in blocks of {block_size} (expected {expected}); refusing the record")
        return cls(path, size, checksum, block_size, tuple(blocks), spans)

    @classmethod
    def hashed(cls, path: str, size: int, h: BlockHasher) -> FileEntry:
        """The entry of a file whose bytes (``size`` of them) went through ``h``."""
        return cls(path, size, h.hexdigest(), h.block_size, h.block_digests() if h.block_size else (),
                   h.span_checksums())

    def span(self, offset: int, length: int) -> tuple[int, int, str] | None:
        """The recorded span that is exactly bytes [offset, offset + length), if any."""
        i = bisect.bisect_left(self.spans, (offset, length, ""))
        if i < len(self.spans) and self.spans[i][:2] == (offset, length):
            return self.spans[i]
        return None

    def tiling_spans(self, offset: int, length: int) -> list[tuple[int, int]] | None:
        """The recorded spans that exactly tile bytes [offset, offset + length) (a read map merges
        adjacent items into one range), or None."""
        i = bisect.bisect_left(self.spans, (offset, -1, ""))
        out, at = [], offset
        while at < offset + length and i < len(self.spans) and self.spans[i][0] == at:
            out.append(self.spans[i][:2])
            at += self.spans[i][1]
            i += 1
        return out if out and at == offset + length else None

    def covering_blocks(self, offset: int, length: int, where: str = "record") -> range:
        """The blocks (indices) that hold bytes [offset, offset + length) of this file. Raises
        ManifestError (one line: where, file, range) for a range outside the file, or when the
        record has no block checksums."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ManifestError(f"{where}: {self.path}: bytes {offset}-{offset + length} are outside the file "
                                f"({self.size} bytes)")
        if not self.block_size:
            raise ManifestError(f"{where}: {self.path}: the record has no block checksums (written before they "
                                f"existed): bytes {offset}-{offset + length} cannot be verified on their own")
        if not length:
            return range(0)
        return range(offset // self.block_size, -(-(offset + length) // self.block_size))

    def block_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of block ``index``."""
        off = index * self.block_size
        return off, min(self.block_size, self.size - off)


def _spans_from(raw: Any, path: str, size: int, where: str) -> tuple[tuple[int, int, str], ...]:
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: {path}: 'spans' is not a list")
    out = []
    for r in raw:
        if not (isinstance(r, list) and len(r) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                             for v in r[:2]) and isinstance(r[2], str) and r[2]):
            raise ManifestError(f"{where}: {path}: bad span {r!r} (expected [offset, length, checksum])")
        off, n = r[0], r[1]
        if off < 0 or n <= 0 or off + n > size:
            raise ManifestError(f"{where}: {path}: span bytes {off}-{off + n} is outside the file ({size} bytes)")
        out.append((off, n, r[2]))
    return tuple(sorted(out))


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


Range = tuple[str, int, int]
"""(file path inside the step folder, offset, length)."""


def ranges_from(raw: Any, where: str) -> list[Range]:
    """A list of [path, offset, length] as Ranges (ManifestError, one line, if malformed)."""
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: a list of byte ranges is not a list")
    out = []
    for r in raw:
        ok = isinstance(r, (list, tuple)) and len(r) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r[1:])
        if not ok:
            raise ManifestError(f"{where}: bad byte range {r!r} (expected [path, offset, length])")
        out.append((check_relpath(r[0], where), r[1], r[2]))
    return out


def _read_map_from(raw: Any, m: Manifest, where: str) -> list[list[Range]]:
    """A format-1 record's read map (one list of ranges per rank, each checked by :func:`checked_reads`)."""
    if not isinstance(raw, list) or len(raw) != m.world_size:
        raise ManifestError(f"{where}: 'read_map' does not hold one list per rank of {m.world_size}")
    files = {f.path: f for f in m.files}
    return [checked_reads(reads, rank, files, where) for rank, reads in enumerate(raw)]


def checked_reads(raw: Any, rank: int, files: dict[str, FileEntry], where: str) -> list[Range]:
    """One rank's read map, each range checked against the record's files (by path): a range of a file the
    record does not list, or outside its file, is refused with one line (checkpoint, file, range)."""
    ranges = ranges_from(raw, f"{where}: read_map of rank {rank}")
    for path, off, length in ranges:
        f = files.get(path)
        if f is None:
            raise ManifestError(f"{where}: rank {rank} reads bytes {off}-{off + length} of {path}, a file "
                                f"missing from the record")
        f.covering_blocks(off, length, where)
    return ranges


def load_json(data: bytes, where: str) -> dict[str, Any]:
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


@dataclass(frozen=True)
class ObjectRef:
    """An object of the step's own folder that the record names: its name, size and checksum (of the record's
    algorithm)."""

    name: str
    size: int
    checksum: str

    def to_list(self) -> list[Any]:
        return [self.name, self.size, self.checksum]

    @classmethod
    def _checked(cls, raw: Any, name_ok: bool, what: str, where: str) -> Any:
        """``raw`` ([name, size, checksum]) as this type, or ManifestError naming ``what``."""
        if not (name_ok and isinstance(raw, list) and len(raw) == 3 and isinstance(raw[1], int)
                and not isinstance(raw[1], bool) and raw[1] > 0 and isinstance(raw[2], str) and raw[2]):
            raise ManifestError(f"{where}: bad {what}: {raw!r} (expected [name, size, checksum])")
        return cls(raw[0], raw[1], raw[2])


@dataclass(frozen=True)
class PartRef(ObjectRef):
    """One rank's part of a format-2 record (:mod:`.parts`), in the step's ``parts/`` folder."""

    @classmethod
    def from_raw(cls, raw: Any, rank: int, where: str) -> PartRef:
        name_ok = isinstance(raw, list) and bool(raw) and layout.parse_part_name(raw[0]) == rank
        return cls._checked(raw, name_ok, f"part of rank {rank}", where)


def _parts_from(raw: Any, world_size: int, where: str) -> list[PartRef]:
    if not isinstance(raw, list) or len(raw) != world_size:
        raise ManifestError(f"{where}: 'parts' does not hold one part per rank of {world_size}")
    return [PartRef.from_raw(p, rank, where) for rank, p in enumerate(raw)]


@dataclass(frozen=True)
class GatheredRef(ObjectRef):
    """The object in the step's own folder (:func:`.layout.spans_path`) that holds every file's spans
    (:attr:`FileEntry.spans`: the small items other ranks read), gathered by the committer in
    :func:`gathered_layout` order: a node fetches them with one GET instead of one per file."""

    @classmethod
    def from_raw(cls, raw: Any, where: str) -> GatheredRef:
        name_ok = isinstance(raw, list) and bool(raw) and layout.is_spans_name(raw[0])
        return cls._checked(raw, name_ok, "'gathered'", where)


def gathered_layout(files: list[FileEntry]) -> list[tuple[str, int, int, str]]:
    """Every file's spans as (path, offset, length, checksum), in the order the gathered object holds them
    (files by path, each file's spans by offset)."""
    return [(f.path, o, n, c) for f in sorted(files, key=lambda f: f.path) for o, n, c in f.spans]


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
    parts: list[PartRef] | None = None
    """Format 2: per rank of the saving world size, its part (:mod:`.parts`: the byte ranges that rank's
    DCP load reads, worked out by DCP's load planner on the saving rank, :mod:`slurm_titan.rank.dcp_plan`);
    None in records without read maps (every node of the saving world size then fetches the whole
    checkpoint; on another world size the loading ranks work out their reads at restore time: :mod:`.share`)."""
    read_map: list[list[Range]] | None = None
    """Format 1: the read maps of all ranks, inline (what ``parts`` name in format 2)."""
    gathered: GatheredRef | None = None
    """The files' spans gathered into one object (None in records written before it, without spans, or with
    more than commit.GATHERED_MAX_BYTES of them: each span is then fetched from its file)."""
    data_dir: str = ""
    """The folder of the step folder that holds the files (:func:`.layout.attempt_dir` of the attempt that uploaded
    them); "" in records written before attempts had folders, by a writer without an attempt id, and in a restored
    copy (whose files are in the step folder itself)."""
    format: str = FORMAT
    raw: bytes = field(default=b"", repr=False, compare=False)
    """The bytes this record was read from (b"": built here): what a restore copies, unparsed."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def key(self, path: str) -> str:
        """The object of file ``path`` in the location that holds this record."""
        return layout.data_key(self.step, self.data_dir, path)

    def local_copy(self) -> bytes:
        """The record of a restored copy, whose files are in its step folder: as fetched when it names no folder
        (nothing re-serialized), else written anew without it."""
        if not self.data_dir:
            return self.raw or self.to_json()
        return replace(self, data_dir="", raw=b"").to_json()

    def _body(self, blocks_listed: bool) -> dict[str, Any]:
        body = {
            "format": self.format,
            "step": self.step,
            "world_size": self.world_size,
            "config_digest": self.config_digest,
            "attempt": self.attempt,
            "saved_at": self.saved_at,
            "committed_at": self.committed_at,
            "checksum_algorithm": self.algorithm,
            "total_bytes": self.total_bytes,
            "files": [f.to_dict(blocks_listed) for f in sorted(self.files, key=lambda f: f.path)],
            "extra": self.extra,
        }
        if self.parts is not None:
            body["parts"] = [p.to_list() for p in self.parts]
        if self.gathered is not None:
            body["gathered"] = self.gathered.to_list()
        if self.data_dir:
            body["data_dir"] = self.data_dir
        return body

    def to_json(self) -> bytes:
        """The format-2 index, compact (a record read from format 1 cannot be written back)."""
        if self.format != FORMAT or self.read_map is not None:
            raise ManifestError(f"step {self.step}: a {self.format} record is only read, never written")
        return compact_json(self._body(False))

    def view(self, read_map: list[list[Range]] | None) -> dict[str, Any]:
        """The record in format 1's shape (block checksums listed, the read map inline: ``read_map``, the
        parts' ranges in rank order, or None): what ``ckpt show --json`` prints, whatever the format."""
        body = self._body(True)
        if read_map is not None:
            body["read_map"] = [[list(r) for r in reads] for reads in read_map]
        return body

    @classmethod
    def from_json(cls, data: bytes, where: str = "commit record", step: int | None = None) -> Manifest:
        obj = load_json(data, where)
        fmt = obj.get("format")
        if fmt not in (FORMAT, FORMAT_1):
            raise ManifestError(f"{where}: unknown format {fmt!r}")
        extra = obj.get("extra")
        m = cls(
            step=_int_field(obj, "step", where),
            world_size=_int_field(obj, "world_size", where, minimum=1),
            files=_files_from(obj.get("files"), where),
            algorithm=str(obj.get("checksum_algorithm") or ""),
            config_digest=str(obj.get("config_digest") or ""),
            attempt=str(obj.get("attempt") or ""),
            saved_at=str(obj.get("saved_at") or ""),
            committed_at=str(obj.get("committed_at") or ""),
            extra=extra if isinstance(extra, dict) else {},
            format=fmt,
            raw=data,
        )
        if fmt == FORMAT_1 and obj.get("read_map") is not None:
            m.read_map = _read_map_from(obj["read_map"], m, where)
        if fmt == FORMAT and obj.get("parts") is not None:
            m.parts = _parts_from(obj["parts"], m.world_size, where)
        if fmt == FORMAT and obj.get("gathered") is not None:
            m.gathered = GatheredRef.from_raw(obj["gathered"], where)
        if fmt == FORMAT and obj.get("data_dir") is not None:
            if not layout.is_attempt_dir(obj["data_dir"]):
                raise ManifestError(f"{where}: bad 'data_dir': {obj['data_dir']!r} (expected attempt-<id>)")
            m.data_dir = obj["data_dir"]
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
    reads: list[Range] | None = None
    """The byte ranges this rank's DCP load of the step reads (None: not known), before they go to its
    part (:func:`.commit.write_receipt`); in receipts written before parts, inline."""
    part: PartRef | None = None
    """This rank's part of the record (its reads), written before the receipt."""

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
        if self.reads is not None:
            body["reads"] = [list(r) for r in self.reads]
        if self.part is not None:
            body["part"] = self.part.to_list()
        return compact_json(body)

    @classmethod
    def from_json(cls, data: bytes, where: str = "receipt") -> Receipt:
        obj = load_json(data, where)
        if obj.get("format") != RECEIPT_FORMAT:
            raise ManifestError(f"{where}: unknown format {obj.get('format')!r}")
        rank = _int_field(obj, "rank", where)
        return cls(
            step=_int_field(obj, "step", where),
            rank=rank,
            world_size=_int_field(obj, "world_size", where, minimum=1),
            attempt=str(obj.get("attempt") or ""),
            files=_files_from(obj.get("files"), where),
            algorithm=str(obj.get("checksum_algorithm") or ""),
            uploaded_at=str(obj.get("uploaded_at") or ""),
            saved_at=str(obj.get("saved_at") or ""),
            failed=str(obj.get("failed") or ""),
            reads=None if obj.get("reads") is None else ranges_from(obj["reads"], where),
            part=None if obj.get("part") is None else PartRef.from_raw(obj["part"], rank, where),
        )
