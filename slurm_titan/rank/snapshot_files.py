"""One rank's RAM snapshot as files: its tensors' raw bytes one after the other in ``data``, the rest pickled in
``.metadata``.

A snapshot is read back by the same rank of the same world size only (:mod:`.ram_snapshot`), so it needs no
portable layout and no planning: a DTensor is kept as its local tensor, a Stateful object as its state dict, and
the load puts each tensor's bytes back into the tensor at the same place of the state it is given. Against DCP's
asynchronous save of the same state (its DefaultStager, then FileSystemWriter; FileSystemReader), the copy that
stops training takes 0.45x the CPU, the write in the background 0.27x, a read 0.41x (the debug model's state:
``tools/bench/ram_snapshot_write.py``; docs/measurements.md, "Fewer CPU-seconds per snapshot").

:class:`Stager` copies the state into buffers it keeps from one snapshot to the next (pinned on an accelerator,
the copies non-blocking, then one synchronize); :func:`write` writes a staged state into a folder (no other
thread may stage meanwhile); :func:`load` reads a folder into a state in place, and gives each Stateful its
loaded state dict.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

DATA = "data"
METADATA = ".metadata"
FORMAT = 1


@dataclass(frozen=True)
class Slot:
    """Where a tensor was in a staged state: its index in the snapshot's tensors."""

    index: int


@dataclass(frozen=True)
class Extent:
    """Where a tensor's bytes lie in ``data``, its dtype and shape (its local tensor's, for a DTensor)."""

    offset: int
    length: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Staged:
    """A state copied for a snapshot: its skeleton (the state, each tensor a :class:`Slot`), pickled, and the
    copies of its tensors."""

    skeleton: bytes
    tensors: list[torch.Tensor]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()


def _resolved(states: dict[str, Any]) -> dict[str, Any]:
    """``states`` with each Stateful object as its state dict (what DCP saves of it)."""
    return {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in states.items()}


def _skeleton(state: Any, tensors: list[torch.Tensor]) -> Any:
    """``state`` with each tensor (in dicts, lists and tuples) a :class:`Slot`, its local tensor appended to
    ``tensors``; any other value as it is."""
    if isinstance(state, torch.Tensor):
        tensors.append(_local(state))
        return Slot(len(tensors) - 1)
    if isinstance(state, dict):
        return {key: _skeleton(value, tensors) for key, value in state.items()}
    if type(state) in (list, tuple):
        return type(state)(_skeleton(value, tensors) for value in state)
    return state


class Stager:
    """Copies a state into buffers kept from one snapshot to the next; ``accelerator``: pinned buffers and
    non-blocking copies, then one synchronize."""

    def __init__(self, accelerator: bool) -> None:
        self.accelerator = accelerator
        self.buffers: list[torch.Tensor] = []

    def stage(self, states: dict[str, Any]) -> Staged:
        """A copy of ``states`` that training may go on changing: the tensors into the kept buffers, the rest
        pickled. The buffers are the previous snapshot's: its write must be over."""
        tensors: list[torch.Tensor] = []
        skeleton = pickle.dumps(_skeleton(_resolved(states), tensors), protocol=pickle.HIGHEST_PROTOCOL)
        kept = self.buffers
        self.buffers = [kept[i] if i < len(kept) and (kept[i].shape, kept[i].dtype) == (tensor.shape, tensor.dtype)
                        else torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.accelerator)
                        for i, tensor in enumerate(tensors)]
        for buffer, tensor in zip(self.buffers, tensors, strict=True):
            buffer.copy_(tensor, non_blocking=self.accelerator)
        if self.accelerator:
            torch.accelerator.synchronize()
        return Staged(skeleton, self.buffers)


def _raw(tensor: torch.Tensor) -> memoryview:
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def write(staged: Staged, folder: Path) -> None:
    """Write ``staged`` into ``folder`` (made if missing): ``data``, then ``.metadata``."""
    folder.mkdir(parents=True, exist_ok=True)
    extents = []
    with open(folder / DATA, "wb") as out:
        for tensor in staged.tensors:
            offset = out.tell()
            out.write(_raw(tensor))
            extents.append(Extent(offset, out.tell() - offset, tensor.dtype, tuple(tensor.shape)))
    with open(folder / METADATA, "wb") as out:
        pickle.dump({"format": FORMAT, "skeleton": staged.skeleton, "extents": extents}, out,
                    protocol=pickle.HIGHEST_PROTOCOL)


def _merged(target: Any, saved: Any, where: str, slots: list[tuple[int, str, torch.Tensor]]) -> Any:
    """``target`` with the saved values of ``saved`` (its skeleton): each tensor of ``target`` kept, to be filled
    in place (its local tensor and its slot appended to ``slots``), every other value the saved one."""
    if isinstance(saved, Slot):
        if not isinstance(target, torch.Tensor):
            raise ValueError(f"{where}: a tensor saved, {type(target).__name__} to load")
        slots.append((saved.index, where, _local(target)))
        return target
    if isinstance(target, torch.Tensor):
        raise ValueError(f"{where}: {type(saved).__name__} saved, a tensor to load")
    if isinstance(target, dict) and isinstance(saved, dict):
        if missing := [key for key in target if key not in saved]:
            raise ValueError(f"{where}: not in the snapshot: {', '.join(map(str, missing[:5]))}")
        return {key: _merged(value, saved[key], f"{where}{key}.", slots) for key, value in target.items()}
    if type(target) in (list, tuple) and type(saved) is type(target) and len(saved) == len(target):
        return type(target)(_merged(value, old, f"{where}{i}.", slots)
                            for i, (value, old) in enumerate(zip(target, saved, strict=True)))
    if _holds_tensor(target):  # its tensors would go unloaded
        raise ValueError(f"{where.rstrip('.') or 'the state'}: {type(saved).__name__} saved, "
                         f"{type(target).__name__} of tensors to load")
    return saved


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(item) for item in value.values())
    return type(value) in (list, tuple) and any(_holds_tensor(item) for item in value)


def _fill(path: Path, extents: list[Extent], slots: list[tuple[int, str, torch.Tensor]]) -> None:
    """Fill each slot's tensor from ``path``, in the order its bytes lie there."""
    with open(path, "rb") as source:
        for index, where, target in sorted(slots, key=lambda slot: extents[slot[0]].offset):
            extent = extents[index]
            if (extent.dtype, extent.shape) != (target.dtype, tuple(target.shape)):
                raise ValueError(f"{where.rstrip('.')}: {extent.dtype} {list(extent.shape)} saved, "
                                 f"{target.dtype} {list(target.shape)} to load")
            source.seek(extent.offset)
            raw = bytearray(source.read(extent.length))
            if len(raw) != extent.length:
                raise OSError(f"{path} ends inside {where.rstrip('.')}")
            stored = torch.frombuffer(raw, dtype=extent.dtype) if raw else torch.empty(0, dtype=extent.dtype)
            target.copy_(stored.view(extent.shape))


def load(states: dict[str, Any], folder: Path) -> None:
    """Load the snapshot in ``folder`` into ``states``: its tensors (a DTensor's local tensor) in place, every
    other value set; a Stateful object gets its loaded state dict. A value of ``states`` that the snapshot lacks,
    a tensor of another dtype or shape, or a data file cut short raise (ValueError, OSError); nothing of
    ``states`` but tensors is changed then."""
    with open(folder / METADATA, "rb") as source:
        metadata = pickle.load(source)  # noqa: S301 - the node's own snapshot, or its partner's (token-checked)
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{folder / METADATA}: not a snapshot of this version's format")
    saved = pickle.loads(metadata["skeleton"])  # noqa: S301 - as above
    slots: list[tuple[int, str, torch.Tensor]] = []
    merged = _merged(_resolved(states), saved, "", slots)
    _fill(folder / DATA, metadata["extents"], slots)
    for key, value in states.items():
        if isinstance(value, Stateful):
            value.load_state_dict(merged[key])
        else:
            states[key] = merged[key]
