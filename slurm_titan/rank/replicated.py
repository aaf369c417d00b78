"""Replicated DTensors handed to DCP as shards, so that each node reads its part of them, not all of it.

DCP keeps a tensor that every rank holds whole (a DTensor replicated over its mesh) once, in one rank's file
(deduplicated at save), and every rank's load reads it whole: on a restore every node fetches it from the
store. torchtitan makes such tensors of real weights: its fused QKV projection (``FusedQKVLinear``, llama3's
default) splits ``wqkv`` into the stock ``wq``/``wk``/``wv`` in a state-dict hook after gathering it to
Replicate (``models/common/attention.py``), so that in llama3 70B ~9.6% of the weights (~27 GB in fp32)
reach every node on every restore; on the debug model they are what each node fetched beyond
checkpoint/N (1.23x on 4 nodes).

:func:`sharded` gives DCP the same tensors as Shard(0) over the mesh's first dimension instead, a local
slice of what each rank holds (no communication): each rank saves and reads its rows only. Keys, global
shapes and values stay the same, so a checkpoint saved either way loads either way (DCP reshards), and
what the load fills goes back through torchtitan's own load hooks (``_merge_qkv_on_load`` gathers to
Replicate again) or a parameter's ``copy_`` (DTensor redistributes).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor, Replicate, Shard


def sharded(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` (a new dict) with each top-level DTensor replicated over its mesh, whose first dimension
    has several ranks and no more than the tensor has rows, as Shard(0) over that dimension."""
    return {key: _shards(value) if _spreadable(value) else value for key, value in state_dict.items()}


def _spreadable(value: object) -> bool:
    return (isinstance(value, DTensor) and value.dim() > 0 and value.device_mesh.size(0) > 1
            and all(isinstance(p, Replicate) for p in value.placements)
            and value.shape[0] >= value.device_mesh.size(0))


def _shards(tensor: DTensor) -> DTensor:
    return tensor.redistribute(tensor.device_mesh, [Shard(0)] + [Replicate()] * (tensor.device_mesh.ndim - 1))
