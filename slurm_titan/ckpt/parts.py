"""One rank's part of a format-2 commit record: the byte ranges its DCP load reads (its read map).

Each rank writes its own part (:func:`write_part`) before its receipt, under a name no other writer
uses (a random token: a part is never replaced, so two attempts saving one step cannot mix theirs);
its receipt names the part with its size and checksum, and the committer copies those into the index
(:mod:`.manifest`), which alone is the commit point. The committer reads no part: it only finds each in
its listing of the step folder, at its size. A part is read only through an index that names its
checksum (:func:`rank_reads`): a node reads the index and its own ranks' parts, never the others'.
"""

from __future__ import annotations

import secrets

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.checksum import hash_bytes
from slurm_titan.ckpt.manifest import (
    FORMAT_1,
    Manifest,
    ManifestError,
    PartRef,
    Range,
    checked_reads,
    compact_json,
    load_json,
)
from slurm_titan.ckpt.storage import Store
from slurm_titan.errors import StorageError

PART_FORMAT = "slurm-titan-part/1"


def part_bytes(step: int, rank: int, reads: list[Range]) -> bytes:
    """A part as JSON (compact)."""
    body = {"format": PART_FORMAT, "step": step, "rank": rank, "reads": [list(r) for r in reads]}
    return compact_json(body)


def write_part(store: Store, step: int, rank: int, reads: list[Range], algorithm: str) -> PartRef:
    """Write one rank's part of step N (a fresh name each time); what its receipt says of it."""
    data = part_bytes(step, rank, reads)
    ref = PartRef(layout.part_name(rank, secrets.token_hex(8)), len(data), hash_bytes(data, algorithm))
    store.put_bytes(layout.part_path(step, ref.name), data)
    return ref


def rank_reads(store: Store, m: Manifest, ranks: list[int]) -> dict[int, list[Range]] | None:
    """Per rank of ``ranks`` (of the saving world size), the byte ranges its load reads, from its part
    (format 2) or the inline read map (format 1); None when the record has no read maps. StorageError (one
    line) for a rank outside the world size; ManifestError (one line: which part, why) for a part missing,
    unlike its checksum, or naming bytes outside the record's files: the checkpoint is then refused like any
    record that does not hold together."""
    bad = [r for r in ranks if not 0 <= r < m.world_size]
    if bad:
        raise StorageError(f"{store.url(layout.commit_path(m.step))}: rank {bad[0]} is not one of the "
                           f"{m.world_size} ranks that saved step {m.step}")
    if m.format == FORMAT_1:
        return None if m.read_map is None else {r: m.read_map[r] for r in ranks}
    if m.parts is None:
        return None
    paths = {r: layout.part_path(m.step, m.parts[r].name) for r in ranks}
    blobs = store.cat_many(list(paths.values()))
    files = {f.path: f for f in m.files}
    out = {}
    for r, path in paths.items():
        where, ref, data = store.url(path), m.parts[r], blobs.get(path)
        if data is None:
            raise ManifestError(f"{where}: the part of rank {r} named by the commit record is missing")
        if len(data) != ref.size or hash_bytes(data, m.algorithm) != ref.checksum:
            raise ManifestError(f"{where}: the part of rank {r} is not the one the commit record names "
                                f"({len(data)} bytes, expected {ref.size} with {m.algorithm} {ref.checksum[:12]}...)")
        obj = load_json(data, where)
        if obj.get("format") != PART_FORMAT or obj.get("step") != m.step or obj.get("rank") != r:
            raise ManifestError(f"{where}: not the part of rank {r} of step {m.step}")
        out[r] = checked_reads(obj.get("reads"), r, files, where)
    return out


def all_reads(store: Store, m: Manifest) -> list[list[Range]] | None:
    """Every rank's reads in rank order (``ckpt show --json``): :func:`rank_reads` of all ranks."""
    reads = rank_reads(store, m, list(range(m.world_size)))
    return None if reads is None else [reads[r] for r in range(m.world_size)]
