"""Names of the objects in a checkpoint location (relative, '/'-separated paths).

    <root>/step-<N>/attempt-<A>/...                     torchtitan's DCP files (.metadata, __R_I.distcp) as
                                                        attempt A uploaded them (records before: in step-<N>/)
    <root>/step-<N>/.slurm-titan/receipts/attempt-<A>/rank-<R>.json  per-rank upload receipt of attempt A
    <root>/step-<N>/.slurm-titan/parts/rank-<R>.<T>.json one rank's part of the commit record (its read map)
    <root>/step-<N>/.slurm-titan/spans.<T>.bin           the small items other ranks read, gathered at commit
    <root>/step-<N>/.slurm-titan/commit.json             the commit record's index, written last, create-only
    <root>/.slurm-titan/catalog/step-<N>.w<W>.f<F>.b<B>  catalog entry written right after the commit
    <root>/.slurm-titan/lease/g-<G>.json                generation G of the location's writer lease (:mod:`.lease`)

Every object an attempt writes is its own: the data files and receipts in its ``attempt-<A>`` folder, the parts
and the gathered spans under names unique to their writer, the commit record and lease create-only. So a stale
attempt (a node cut off that kept running, an uploader frozen and thawed) can never overwrite an object of a
committed checkpoint or of a newer attempt: the commit record names the folder its data is in
(``Manifest.data_dir``), and nothing reads data files but through the record. A writer without an attempt id
(``CheckpointSync(attempt="")``, outside a job) writes in the step folder itself, as before.

The catalog entry's name carries the checkpoint's world size, file count and byte count, so
that listing a location takes a constant number of LIST requests (one of the root, one of
the catalog) however many checkpoints it holds; the commit record stays the truth.
"""

from __future__ import annotations

import hashlib
import re

META_DIR = ".slurm-titan"
"""Directory (inside each step folder and at the root) holding slurm-titan's own records."""

CATALOG_DIR = f"{META_DIR}/catalog"

LEASE_DIR = f"{META_DIR}/lease"

COMMIT_RECORD = f"{META_DIR}/commit.json"
"""The commit record's path inside a step folder (remote, or a restored local copy)."""

DCP_METADATA = ".metadata"
"""DCP's metadata file inside a step folder (what a load plans from)."""

_STEP_DIR_RE = re.compile(r"^step-(\d+)$")
_ATTEMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_ATTEMPT_DIR_RE = re.compile(r"^attempt-[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_LEASE_RE = re.compile(r"^g-(\d+)\.json$")
_CATALOG_RE = re.compile(r"^step-(\d+)\.w(\d+)\.f(\d+)\.b(\d+)$")
_RANK_DATA_RE = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_META_RE = re.compile(r"^__(\d+)\.metadata$")
_RECEIPT_RE = re.compile(r"^rank-(\d+)\.json$")
_PART_RE = re.compile(r"^rank-(\d+)\.[0-9a-f]{8,32}\.json$")
_SPANS_RE = re.compile(r"^spans\.[0-9a-f]{8,32}\.bin$")


def step_dir(step: int) -> str:
    return f"step-{int(step)}"


def parse_step_dir(name: str) -> int | None:
    """The step of a ``step-N`` folder name, or None."""
    m = _STEP_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def commit_path(step: int) -> str:
    return f"{step_dir(step)}/{COMMIT_RECORD}"


def attempt_dir(attempt: str) -> str:
    """The folder of attempt ``attempt``'s own objects (its data files in ``step-N/``, its receipts): ``attempt-<id>``
    (an id that is not a plain name: its digest); "" for a writer without an attempt id."""
    if not attempt:
        return ""
    name = attempt if _ATTEMPT_ID_RE.match(attempt) else hashlib.sha256(attempt.encode()).hexdigest()[:16]
    return f"attempt-{name}"


def is_attempt_dir(name: object) -> bool:
    """Whether ``name`` is what :func:`attempt_dir` makes ("" included)."""
    return name == "" or (isinstance(name, str) and _ATTEMPT_DIR_RE.match(name) is not None)


def data_key(step: int, data_dir: str, path: str) -> str:
    """The object of file ``path`` (inside its step folder) uploaded into ``data_dir`` (:func:`attempt_dir`)."""
    return f"{step_dir(step)}/{data_dir}/{path}" if data_dir else f"{step_dir(step)}/{path}"


def receipt_dir(step: int, attempt: str) -> str:
    """The receipts of ``attempt`` ("": the folder of every attempt's, where a writer without an id writes)."""
    own = attempt_dir(attempt)
    return f"{step_dir(step)}/{META_DIR}/receipts" + (f"/{own}" if own else "")


def receipt_path(step: int, rank: int, attempt: str) -> str:
    return f"{receipt_dir(step, attempt)}/rank-{int(rank):05d}.json"


def part_name(rank: int, token: str) -> str:
    """The name of one rank's part of a commit record (``token``: hex, unique to the writer)."""
    return f"rank-{int(rank):05d}.{token}.json"


def parts_dir(step: int) -> str:
    return f"{step_dir(step)}/{META_DIR}/parts"


def part_path(step: int, name: str) -> str:
    return f"{parts_dir(step)}/{name}"


def parse_part_name(name: object) -> int | None:
    """The rank of a part's name (:func:`part_name`), or None when ``name`` is not one."""
    m = _PART_RE.match(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


def spans_name(token: str) -> str:
    """The name of a step's gathered small items (``token``: hex, unique to the committer)."""
    return f"spans.{token}.bin"


def spans_path(step: int, name: str) -> str:
    return f"{step_dir(step)}/{META_DIR}/{name}"


def is_spans_name(name: object) -> bool:
    return isinstance(name, str) and _SPANS_RE.match(name) is not None


def parse_receipt_name(name: str) -> int | None:
    m = _RECEIPT_RE.match(name)
    return int(m.group(1)) if m else None


def lease_path(generation: int) -> str:
    """Generation ``generation`` of the writer lease (zero-padded: names sort as numbers)."""
    return f"{LEASE_DIR}/g-{int(generation):010d}.json"


def parse_lease_name(name: str) -> int | None:
    """The generation of a lease object's base name (:func:`lease_path`), or None."""
    m = _LEASE_RE.match(name)
    return int(m.group(1)) if m else None


def catalog_entry(step: int, world_size: int, files: int, nbytes: int) -> str:
    return f"{CATALOG_DIR}/step-{int(step)}.w{int(world_size)}.f{int(files)}.b{int(nbytes)}"


def parse_catalog_entry(name: str) -> tuple[int, int, int, int] | None:
    """(step, world_size, files, bytes) from a catalog entry's base name, or None."""
    m = _CATALOG_RE.match(name)
    return tuple(int(g) for g in m.groups()) if m else None  # type: ignore[return-value]


def is_meta(rel_in_step: str) -> bool:
    """Whether a path inside a step folder is slurm-titan's own (receipts, commit)."""
    return rel_in_step == META_DIR or rel_in_step.startswith(META_DIR + "/")


def file_owner(name: str) -> int:
    """The global rank that uploads a file of a DCP step folder.

    ``__R_I.distcp`` and ``__R.metadata`` belong to rank R; every other file (``.metadata``,
    anything torchtitan adds) belongs to rank 0.
    """
    base = name.rsplit("/", 1)[-1]
    if "/" not in name:
        m = _RANK_DATA_RE.match(base) or _RANK_META_RE.match(base)
        if m:
            return int(m.group(1))
    return 0


def is_temporary(name: str) -> bool:
    """Files a DCP save leaves only while it runs (``.metadata.tmp``)."""
    return name.endswith(".tmp")
