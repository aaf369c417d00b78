"""The packed-document tables of a batch made once, on the host, by the data loader.

torchtitan's decoder builds the attention's ``VarlenMetadata`` for every microbatch from ``positions`` on the
device (``create_varlen_metadata_for_document``: a ``nonzero`` per batch row and an ``.item()``, each a host
sync), and ``npu_fusion_attention`` then needs the cumulative lengths on the host again (``.tolist()``). Here
the resharding data loader (:mod:`.resharding_loader`) computes the document offsets of each batch from its CPU
``positions`` (:func:`document_offsets`, what torchtitan computes) and yields its inputs as a
:class:`TabledInputs`; the device copy of ``positions`` the trainer stores in it carries them, and, once the
attention override is applied (:func:`use_host_tables`), the decoder builds the metadata from them
(:func:`host_varlen_metadata`: ``cu_seq_q`` stays a CPU tensor, which the attention override never reads once
``cu_seq_q_host`` is set). Positions without offsets (another loader) get torchtitan's device-side metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate
from torchtitan.models.common import decoder
from torchtitan.models.common.attention import VarlenMetadata

OFFSETS_ATTRIBUTE = "slurm_titan_document_offsets"
"""The attribute of a ``positions`` tensor that holds its batch's document offsets."""


def document_offsets(positions: torch.Tensor) -> tuple[int, ...]:
    """The start of every document in ``batch * seq_len`` token space (where a row's positions are 0), then the
    total: torchtitan's packed ``cu_seq_q``, computed from CPU ``positions`` ``(B, L)``."""
    batch, seq_len = positions.shape
    rows, columns = (positions == 0).nonzero(as_tuple=True)
    return (*(rows * seq_len + columns).tolist(), batch * seq_len)


def host_varlen_metadata(offsets: Sequence[int]) -> VarlenMetadata:
    """``VarlenMetadata`` of a batch from its :func:`document_offsets`, with no device tensor and no sync."""
    longest = max((end - start for start, end in zip(offsets, offsets[1:])), default=0)
    cu_seq = torch.tensor(offsets, dtype=torch.int32)
    return VarlenMetadata(cu_seq_q=cu_seq, cu_seq_k=cu_seq, max_q=longest, max_k=longest,
                          cu_seq_q_host=tuple(offsets))


class TabledInputs(dict):
    """A batch's input dict whose ``positions``, and each tensor the trainer stores as ``positions`` (its device
    copy), carry the batch's document offsets (:data:`OFFSETS_ATTRIBUTE`)."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        super().__init__()
        self.offsets = document_offsets(inputs["positions"])
        for key, value in inputs.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "positions" and isinstance(value, torch.Tensor):
            setattr(value, OFFSETS_ATTRIBUTE, self.offsets)
        super().__setitem__(key, value)


def collate_with_tables(samples: list[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> tuple[TabledInputs,
                                                                                                torch.Tensor]:
    """The data loader's ``collate_fn``: torchtitan's batch (default collation), inputs as :class:`TabledInputs`."""
    inputs, labels = default_collate(samples)
    return TabledInputs(inputs), labels


def varlen_metadata(positions: torch.Tensor, *, include_host_offsets: bool = False) -> VarlenMetadata:
    """torchtitan's ``create_varlen_metadata_for_document``, from ``positions``' host offsets when it has them."""
    offsets = getattr(positions, OFFSETS_ATTRIBUTE, None)
    if offsets is None:
        return _DEVICE_METADATA(positions, include_host_offsets=include_host_offsets)
    return host_varlen_metadata(offsets)


_DEVICE_METADATA = decoder.create_varlen_metadata_for_document


def use_host_tables() -> None:
    """Make torchtitan's decoder build its varlen metadata with :func:`varlen_metadata`. Called by the attention
    override's factory: a model override would be an ancestor of the attention's, and torchtitan refuses
    nested overrides, so the decoder's ``get_attention_masks`` cannot be replaced by one."""
    decoder.create_varlen_metadata_for_document = varlen_metadata
