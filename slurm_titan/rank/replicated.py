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

:func:`shard_split_qkv` does the same inside the model's ``state_dict()``, one layer at a time: without it the
split hook's replicated tensors of every layer are alive at once (~27 GB fp32 per rank for llama3 70B) in each
``state_dict()`` and, for good, in the cache of torchtitan's ``ModelWrapper`` (which keeps the tensors of the
first ``state_dict()`` and copies later ones into them); with it each layer's gathered tensors are freed before
the next layer's are made, and the dict holds each rank's rows only (1/8 of that on the 70B config's 8 nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torchtitan.models.common.attention import FusedQKVLinear


def sharded(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` (a new dict) with each top-level DTensor replicated over its mesh, whose first dimension
    has several ranks and no more than the tensor has rows, as Shard(0) over that dimension."""
    return {key: _shards(value) if _spreadable(value) else value for key, value in state_dict.items()}


def shard_split_qkv(model_parts: Iterable[nn.Module]) -> None:
    """Make every fused QKV projection of ``model_parts`` give its ``state_dict()`` entries as :func:`sharded`
    does, right after torchtitan's split hook (a later post-hook of the same module) gathered them."""
    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FusedQKVLinear):
                module.register_state_dict_post_hook(_shard_entries)


def _shard_entries(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: object) -> None:
    """State-dict post-hook: this module's replicated entries as Shard(0) copies (redistribute clones)."""
    for key, value in list(state_dict.items()):
        if key.startswith(prefix) and _spreadable(value):
            state_dict[key] = _shards(value)


def _spreadable(value: object) -> bool:
    return (isinstance(value, DTensor) and value.dim() > 0 and value.device_mesh.size(0) > 1
            and all(isinstance(p, Replicate) for p in value.placements)
            and value.shape[0] >= value.device_mesh.size(0))


def _shards(tensor: DTensor) -> DTensor:
    return tensor.redistribute(tensor.device_mesh, [Shard(0)] + [Replicate()] * (tensor.device_mesh.ndim - 1))
