"""Token shards in object storage (``s3://`` and any store ``open_store`` opens), read through the checkpoint
``Store`` into a node-local cache.

The manifest is read from the store at every start (a dataset changed in the store is seen, not hidden by
the cache), and one process a node (local rank 0) checks the objects' sizes against it in one listing. Each
``.idx`` is fetched whole, its checksum checked against the manifest's record, and kept in the cache; of a
``.bin`` only the blocks holding the documents a rank reads are fetched, with the store's ranged read
(:meth:`Store.download_pieces`: the checkpoint restore's retries and throttling answers), each verified against
the block checksum the upload recorded, then renamed into the cache: a cached block is a verified one, so a
restart on the node fetches nothing again, and ranks of one node that fetch the same block at once each rename a
whole copy. (A cached block is a sparse file holding the block at its own offset: the store's ranged download
writes at the file's offsets.) The cache lives under ``$SLURM_TITAN_DATA_CACHE`` (default
``/var/tmp/slurm-titan-data``), one folder per location, and is never pruned: it holds what the node read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from slurm_titan import envvars
from slurm_titan.ckpt import FileEntry, Store, open_store
from slurm_titan.data.megatron_index import MegatronIndex, read_index
from slurm_titan.data.token_manifest import MANIFEST_FILE, Manifest, ShardInfo, parse_manifest
from slurm_titan.data.token_names import ShardError

DEFAULT_CACHE = "/var/tmp/slurm-titan-data"
OPEN_BLOCKS = 64
"""Cached block files a reader keeps open."""


def cache_root() -> Path:
    return Path(os.environ.get(envvars.DATA_CACHE) or DEFAULT_CACHE)


def _fetch_into(path: Path, fetch: Callable[[str], None]) -> None:
    """``fetch(tmp)`` writes a verified file at a temporary path beside ``path``; it is then renamed there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        fetch(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class BlockReader:
    """A ``.bin`` in the store, read by verified blocks through the node-local cache."""

    def __init__(self, store: Store, entry: FileEntry, algorithm: str, folder: Path, dtype: np.dtype) -> None:
        self.store, self.entry, self.algorithm, self.folder, self.dtype = store, entry, algorithm, folder, dtype
        self._open: OrderedDict[int, int] = OrderedDict()  # block -> fd of its cached file
        self.fetched = 0
        """Blocks this reader fetched from the store (the others were in the cache)."""

    def _fd(self, block: int) -> int:
        if block in self._open:
            self._open.move_to_end(block)
            return self._open[block]
        path = self.folder / f"{block:08d}"
        if not path.exists():
            offset, length = self.entry.block_span(block)

            def fetch(tmp: str) -> None:
                bad = self.store.download_pieces(
                    [(self.entry.path, tmp, offset + length, [(offset, length, self.entry.blocks[block])])],
                    self.algorithm)
                if bad[0]:
                    raise ShardError(f"{self.store.url(self.entry.path)}: bytes {offset}-{offset + length} do not "
                                     "match the checksum the manifest records: the object changed since the upload")

            _fetch_into(path, fetch)
            self.fetched += 1
        self._open[block] = os.open(path, os.O_RDONLY)
        if len(self._open) > OPEN_BLOCKS:
            os.close(self._open.popitem(last=False)[1])
        return self._open[block]

    def read(self, offset: int, count: int) -> np.ndarray:
        size, block_size = count * self.dtype.itemsize, self.entry.block_size
        end = min(offset + size, self.entry.size)
        parts = []
        for block in range(offset // block_size, -(-end // block_size)):
            lo, hi = max(offset, block * block_size), min(end, (block + 1) * block_size)
            parts.append(os.pread(self._fd(block), hi - lo, lo))
        return np.frombuffer(b"".join(parts), dtype=self.dtype)


class StoreSource:
    """A token-shard dataset in a store (see the module docstring)."""

    def __init__(self, location: str, cache: Path | None = None) -> None:
        self.store = open_store(location, check=False)
        self.location = self.store.url()
        digest = hashlib.sha256(self.location.encode()).hexdigest()[:16]
        self.cache = (cache or cache_root()) / digest
        self._manifest: Manifest | None = None
        self._sizes: dict[str, int] | None = None
        self._lists = os.environ.get("LOCAL_RANK", "0") == "0"
        """Whether this process checks the objects' sizes in a listing: one process a node, not every rank at once
        (the others meet a changed object in its checksums, a truncated one in a short read, both one line)."""
        self.readers: list[BlockReader] = []

    def where(self, rel: str) -> str:
        return self.store.url(rel)

    def manifest(self) -> bytes:
        try:
            raw = self.store.cat(MANIFEST_FILE)
        except FileNotFoundError:
            raise ShardError(f"{self.where(MANIFEST_FILE)}: no token-shard manifest there (make one with "
                             "`slurm-titan data prepare --upload`)") from None
        self._manifest = parse_manifest(raw, self.where(MANIFEST_FILE))
        return raw

    def _entry(self, rel: str) -> tuple[FileEntry, str]:
        """The upload's record of ``rel``, its size checked against the store's listing."""
        manifest = self._manifest or parse_manifest(self.manifest(), self.where(MANIFEST_FILE))
        record = manifest.files.get(rel)
        if record is None or not manifest.checksum_algorithm:
            raise ShardError(f"{self.where(rel)}: the manifest records no checksums for it, so its ranges cannot be "
                             "verified: upload the shards with `slurm-titan data prepare --upload`")
        entry = FileEntry.from_dict(record, self.where(MANIFEST_FILE))
        if not self._lists:
            return entry, manifest.checksum_algorithm
        if self._sizes is None:
            self._sizes = {item.path: item.size for item in self.store.find()}
        stored = self._sizes.get(rel)
        if stored is None:
            raise ShardError(f"{self.where(rel)}: missing from the store (the manifest lists it)")
        if stored != entry.size:
            raise ShardError(f"{self.where(rel)}: {stored} bytes in the store, the manifest records {entry.size}: "
                             "truncated or replaced since the upload")
        return entry, manifest.checksum_algorithm

    def index(self, shard: ShardInfo) -> MegatronIndex:
        entry, algorithm = self._entry(shard.idx)
        path = self.cache / f"{entry.checksum.replace(':', '-')}.idx"
        if not path.exists():
            def fetch(tmp: str) -> None:
                ((size, checksum),) = self.store.download_many([(shard.idx, tmp, entry.size)], algorithm=algorithm)
                if checksum != entry.checksum:
                    raise ShardError(f"{self.where(shard.idx)}: its checksum is not the manifest's: the object "
                                     "changed since the upload")

            _fetch_into(path, fetch)
        return read_index(path, self.where(shard.idx))

    def tokens(self, shard: ShardInfo, index: MegatronIndex) -> BlockReader:
        entry, algorithm = self._entry(shard.bin)
        index.check_bin(entry.size, self.where(shard.bin))
        if not entry.block_size:
            raise ShardError(f"{self.where(shard.bin)}: the manifest records no block checksums for it: upload "
                             "the shards with `slurm-titan data prepare --upload`")
        reader = BlockReader(self.store, entry, algorithm, self.cache / f"{entry.checksum.replace(':', '-')}.bin",
                             index.dtype)
        self.readers.append(reader)
        return reader

