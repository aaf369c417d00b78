"""DCP storage for the RAM tier's snapshots: every tensor kept as its raw bytes, one data file per rank.

DCP's FileSystemWriter writes each tensor through ``torch.save`` (a zip record, its CRC32, a pickler and
torch's config lookups, per tensor) and its reader ``torch.load``s each one back: for the debug model's state 2.6x
the CPU time of this module's write, 2.2x of its read (``tools/bench/ram_snapshot_write.py``), taken in the
training process's background thread from the CPU the training uses. A snapshot is read back by this module
only, by the same rank of the same world size, so it needs no portable layout: DCP's planners, its metadata
and its handling of Stateful objects and DTensor shards are kept; only where the bytes lie is this module's.

A folder holds ``data`` (each item's bytes, one after the other) and ``.metadata`` (DCP's Metadata, pickled as
DCP's own writer does, its ``storage_data`` an :class:`Extent` per item).
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint import Metadata, StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from slurm_titan.thread_priority import lower_thread_priority

DATA = "data"
METADATA = ".metadata"


@dataclass(frozen=True)
class Extent:
    """Where an item's bytes lie in ``data``; a tensor's dtype and shape with them (None: pickled bytes)."""

    offset: int
    length: int
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None


def _narrowed(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    """The part of a stored chunk a load asks for (DCP's ``storage_offsets`` and ``lengths``)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        if offset or length != tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _raw(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, row-major (a copy only when it is not contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


class RawWriter(StorageWriter):
    """Writes one rank's items into ``path`` (no collective: for ``no_dist`` saves); the thread that writes first
    raises its nice value by ``nice`` (an async save's writes run in a thread of their own)."""

    def __init__(self, path: str | os.PathLike, nice: int = 0) -> None:
        super().__init__()
        self.path, self.nice = Path(path), nice

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.path = Path(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # chosen by passing a writer, never guessed from a path

    def set_up_storage_writer(self, is_coordinator: bool, *args: object, **kwargs: object) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        lower_thread_priority(self.nice)
        results = []
        with open(self.path / DATA, "wb") as out:
            for item in plan.items:
                data = planner.resolve_data(item)
                offset = out.tell()
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    out.write(data.getbuffer())
                    extent = Extent(offset, out.tell() - offset)
                else:
                    assert isinstance(data, torch.Tensor) and data.device.type == "cpu"
                    out.write(_raw(data))
                    extent = Extent(offset, out.tell() - offset, data.dtype, tuple(data.shape))
                results.append(WriteResult(index=item.index, size_in_bytes=extent.length, storage_data=extent))
        written: Future[list[WriteResult]] = Future()
        written.set_result(results)
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {result.index: result.storage_data for rank in results for result in rank}
        with open(self.path / METADATA, "wb") as out:
            pickle.dump(metadata, out)


class RawReader(StorageReader):
    """Reads what :class:`RawWriter` wrote in ``path`` into the load planner's tensors and objects."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(path)
        self.extents: dict[MetadataIndex, Extent] = {}

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.path = Path(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        with open(self.path / METADATA, "rb") as source:
            metadata = pickle.load(source)  # noqa: S301 - the node's own snapshot, or its partner's (token-checked)
        assert isinstance(metadata, Metadata), f"{self.path / METADATA} holds no DCP metadata"
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: object,
                              **kwargs: object) -> None:
        self.extents = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with open(self.path / DATA, "rb") as source:
            for request in sorted(plan.items, key=lambda r: self.extents[r.storage_index].offset):
                extent: Extent = self.extents[request.storage_index]
                source.seek(extent.offset)
                raw = bytearray(source.read(extent.length))
                if len(raw) != extent.length:
                    raise OSError(f"{self.path / DATA} ends inside {request.storage_index.fqn}")
                if request.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(request, io.BytesIO(raw))
                    continue
                assert extent.dtype is not None and extent.shape is not None
                stored = (torch.frombuffer(raw, dtype=extent.dtype) if raw else
                          torch.empty(0, dtype=extent.dtype)).view(extent.shape)
                stored = _narrowed(stored, request.storage_offsets, request.lengths)
                target = planner.resolve_tensor(request).detach()
                if target.size() != stored.size():
                    raise ValueError(f"{request.storage_index.fqn}: {tuple(stored.size())} stored, "
                                     f"{tuple(target.size())} to load")
                target.copy_(stored)
                planner.commit_tensor(request, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done
