"""Where a token-shard dataset's bytes come from: a folder of the shared file system, or a store (torch-free).

A :class:`ShardSource` gives the manifest, each shard's parsed index and a :class:`TokenReader` over its
``.bin``; :func:`open_source` picks one by the location. A folder's ``.bin`` files are memory-mapped (a
rank's page faults read only the ranges it trains on); ``s3://`` and other store URLs are read through the
checkpoint ``Store`` into a node-local cache (:mod:`.token_store`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from slurm_titan.data.megatron_index import MegatronIndex, open_bin, read_index
from slurm_titan.data.token_manifest import MANIFEST_FILE, ShardInfo
from slurm_titan.data.token_names import ShardError


class TokenReader(Protocol):
    def read(self, offset: int, count: int) -> np.ndarray:
        """``count`` token ids from byte ``offset`` of the ``.bin`` (a view or a copy; never written to)."""
        ...


class ShardSource(Protocol):
    location: str

    def manifest(self) -> bytes:
        """The manifest's bytes; ShardError naming it when there is none."""
        ...

    def where(self, rel: str) -> str:
        """``rel`` (a file of the dataset) as messages name it."""
        ...

    def index(self, shard: ShardInfo) -> MegatronIndex:
        """The shard's parsed and checked ``.idx``."""
        ...

    def tokens(self, shard: ShardInfo, index: MegatronIndex) -> TokenReader:
        """A reader of the shard's ``.bin``, whose size was checked against ``index``."""
        ...


class _Mapped:
    """A memory-mapped ``.bin``."""

    def __init__(self, data: np.ndarray) -> None:
        self._data, self._itemsize = data.view(np.ndarray), data.dtype.itemsize  # slices of a plain view: cheaper

    def read(self, offset: int, count: int) -> np.ndarray:
        start = offset // self._itemsize
        return self._data[start:start + count]


class FolderSource:
    """Shards in a folder of the (shared) file system."""

    def __init__(self, folder: str) -> None:
        self.location = os.path.abspath(os.path.expanduser(folder.removeprefix("file://")))

    def where(self, rel: str) -> str:
        return os.path.join(self.location, rel)

    def manifest(self) -> bytes:
        path = Path(self.where(MANIFEST_FILE))
        try:
            return path.read_bytes()
        except FileNotFoundError:
            what = "no such folder" if not Path(self.location).is_dir() else "no token-shard manifest there"
            raise ShardError(f"{path}: {what} (make one with `slurm-titan data prepare`)") from None
        except OSError as error:
            raise ShardError(f"{path}: cannot read the manifest: {error.strerror}") from None

    def index(self, shard: ShardInfo) -> MegatronIndex:
        return read_index(self.where(shard.idx))

    def tokens(self, shard: ShardInfo, index: MegatronIndex) -> TokenReader:
        return _Mapped(open_bin(self.where(shard.bin), index))


def open_source(location: str) -> ShardSource:
    """The source of the dataset at ``location``: a folder (or ``file://``), else a store URL (``s3://``...)."""
    if "://" not in location or location.startswith("file://"):
        return FolderSource(location)
    from slurm_titan.data.token_store import StoreSource  # fsspec and the store's clients: for stores only

    return StoreSource(location)
