"""Pure translation from torchtitan's packed-document attention to ``npu_fusion_attention`` arguments.

Contract relied on (torch_npu ``npu_fusion_attention``, documented in torch_npu
2.14.0's docstrings and Ascend/op-plugin
``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md``):

* ``input_layout="TND"`` is the varlen layout: query ``(T, Nq, D)``, key/value
  ``(T, Nkv, D)`` with ``Nq % Nkv == 0`` (GQA); ``head_num`` is ``Nq``.
* ``actual_seq_qlen`` / ``actual_seq_kvlen`` are *cumulative* lengths, i.e. the
  end offset of every sequence ("lengths 2 2 2 -> pass 2 4 6").
* ``atten_mask`` is True where attention is masked out. ``sparse_mode=3``
  (rightDownCausal) takes the compressed 2048x2048 upper-triangular mask and
  ignores ``pre_tockens`` / ``next_tockens``; with equal query and key lengths
  per sequence it is plain causal attention inside each sequence.
* ``scale`` defaults to 1.0 (not 1/sqrt(D)); ``keep_prob`` is the dropout
  keep ratio in (0, 1].
* One TND call takes at most 1024 sequences and 2**20 tokens
  (:mod:`.npu_capabilities`): a batch beyond that is split into one call per
  row (rows never share a document, see :func:`document_ends`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
from torchtitan.models.common.attention import VarlenMetadata

from slurm_titan.overrides.npu_capabilities import VARLEN_MAX_SEQUENCES, VARLEN_MAX_TOKENS

RIGHT_DOWN_CAUSAL = 3
"""``sparse_mode`` for per-sequence causal masking from the compressed mask."""

COMPRESSED_MASK_SIZE = 2048
"""Side of the compressed causal mask that sparse modes 2-4 require."""

MAX_TOKENS = 2147483647
"""torch_npu's "unbounded" ``pre_tockens`` default."""


def document_ends(cu_seq_offsets: Sequence[int], batch: int, seq_len: int) -> list[int]:
    """Cumulative end offsets of the packed documents in ``batch * seq_len`` token space.

    ``cu_seq_offsets`` is torchtitan's ``VarlenMetadata.cu_seq_q`` on the host:
    the start of every document (where ``positions`` resets to 0) plus the
    total. Every start after 0 ends the previous document; every row end is an
    end too, so no document runs across two batch rows.
    """
    total = batch * seq_len
    if any(not 0 <= offset <= total for offset in cu_seq_offsets):
        raise ValueError(f"document offsets {list(cu_seq_offsets)} exceed {total} tokens")
    row_ends = range(seq_len, total + 1, seq_len)
    return sorted({offset for offset in cu_seq_offsets if offset > 0}.union(row_ends))


def softmax_scale(scale: float | None, head_dim: int) -> float:
    """torchtitan's ``scale=None`` means 1/sqrt(head_dim); torch_npu's default is 1.0."""
    return head_dim**-0.5 if scale is None else scale


def varlen_calls(doc_ends: Sequence[int], batch: int, seq_len: int) -> list[tuple[slice, list[int]]]:
    """The TND calls for a batch: ``(batch rows, cumulative document ends within them)`` each.

    One call for the whole batch when it fits the varlen limits, else one per
    row; a single row beyond them raises ``ValueError``.
    """
    if len(doc_ends) <= VARLEN_MAX_SEQUENCES and batch * seq_len <= VARLEN_MAX_TOKENS:
        return [(slice(0, batch), list(doc_ends))]
    calls = []
    for row in range(batch):
        start = row * seq_len
        ends = [end - start for end in doc_ends if start < end <= start + seq_len]
        if len(ends) > VARLEN_MAX_SEQUENCES or seq_len > VARLEN_MAX_TOKENS:
            raise ValueError(
                f"batch row {row} holds {len(ends)} documents in {seq_len} tokens; npu_fusion_attention (TND) "
                f"takes at most {VARLEN_MAX_SEQUENCES} documents and {VARLEN_MAX_TOKENS} tokens per call"
            )
        calls.append((slice(row, row + 1), ends))
    return calls


@cache
def compressed_causal_mask(device: torch.device) -> torch.Tensor:
    """The 2048x2048 mask sparse mode 3 expects: True above the diagonal (masked).

    Built on the CPU and copied to ``device``, so no device kernel for a bool
    ``triu`` is needed.
    """
    ones = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, dtype=torch.bool)
    return torch.triu(ones, diagonal=1).to(device)


def fusion_attention_kwargs(
    *,
    n_heads: int,
    head_dim: int,
    doc_ends: Sequence[int],
    scale: float | None,
    dropout: float,
    device: torch.device,
) -> dict[str, Any]:
    """Keyword arguments for ``npu_fusion_attention`` on TND inputs of packed documents."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return {
        "head_num": n_heads,
        "input_layout": "TND",
        "atten_mask": compressed_causal_mask(device),
        "scale": softmax_scale(scale, head_dim),
        "keep_prob": 1.0 - dropout,
        "pre_tockens": MAX_TOKENS,
        "next_tockens": 0,
        "sparse_mode": RIGHT_DOWN_CAUSAL,
        "actual_seq_qlen": list(doc_ends),
        "actual_seq_kvlen": list(doc_ends),
    }


class _LastHostOffsets:
    """``cu_seq_q`` copied to the host once per metadata object.

    Every layer of one forward shares the same ``VarlenMetadata``, so keeping
    the last one turns a device-to-host sync per layer into one per step.
    """

    def __init__(self) -> None:
        self._key: weakref.ref[torch.Tensor] | None = None
        self._offsets: tuple[int, ...] = ()

    def __call__(self, metadata: VarlenMetadata) -> tuple[int, ...]:
        if metadata.cu_seq_q_host is not None:
            return metadata.cu_seq_q_host
        if self._key is None or self._key() is not metadata.cu_seq_q:
            self._key = weakref.ref(metadata.cu_seq_q)
            self._offsets = tuple(int(o) for o in metadata.cu_seq_q.tolist())
        return self._offsets


host_offsets = _LastHostOffsets()
"""``host_offsets(metadata)``: the document start offsets of ``metadata`` as ints."""
