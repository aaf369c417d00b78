"""Override: llama3's inner attention as ``torch_npu.npu_fusion_attention`` over packed documents.

    --override.imports slurm_titan.overrides.npu_attention.npu_fused_attention

Replaces ``FlexAttention.Config`` (llama3's default ``attn_backend="flex"``)
with :class:`NpuFusedAttention`. Its config subclasses
``VarlenAttention.Config``, so torchtitan's decoder hands it
``VarlenMetadata`` (document starts, from where ``positions`` resets to 0)
instead of a FlexAttention ``BlockMask``, built from the data loader's host tables
when its batches carry them (:mod:`.document_tables`: no host sync per microbatch).

Per call: plain tensors on an ``npu`` device run ``npu_fusion_attention`` in
the TND varlen layout with one causal sequence per document (arguments from
:mod:`.attention_args`); everything else runs the plain-torch per-document
reference (:mod:`.reference_attention`). Not supported: context parallelism
(like upstream varlen), sliding windows, and ``out_transform`` (gpt-oss sinks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.attention import FlexAttention, VarlenAttention, VarlenMetadata
from torchtitan.protocols.module import Module

from slurm_titan.overrides.attention_args import document_ends, fusion_attention_kwargs, host_offsets, varlen_calls
from slurm_titan.overrides.document_tables import use_host_tables
from slurm_titan.overrides.kernels import NpuKernels, select_kernels
from slurm_titan.overrides.reference_attention import reference_attention


def npu_attention(
    q_BLNH: torch.Tensor,
    k_BLNH: torch.Tensor,
    v_BLNH: torch.Tensor,
    doc_ends: Sequence[int],
    *,
    scale: float | None,
    dropout: float,
    kernels: NpuKernels,
) -> torch.Tensor:
    """Per-document causal attention via ``kernels.npu_fusion_attention``; returns ``(B, L, Nq, Hv)``.

    One call for the batch, or one per row beyond the varlen limits
    (:func:`.attention_args.varlen_calls`).
    """
    batch, seq_len, n_heads, head_dim = q_BLNH.shape
    outs = []
    for rows, ends in varlen_calls(doc_ends, batch, seq_len):
        kwargs = fusion_attention_kwargs(
            n_heads=n_heads,
            head_dim=head_dim,
            doc_ends=ends,
            scale=scale,
            dropout=dropout,
            device=q_BLNH.device,
        )
        # TND: batch rows folded into one packed token axis; output [0] is attention_out.
        q_TNH, k_TNH, v_TNH = (x[rows].flatten(0, 1) for x in (q_BLNH, k_BLNH, v_BLNH))
        out_TNH = kernels.npu_fusion_attention(q_TNH, k_TNH, v_TNH, **kwargs)[0]
        outs.append(out_TNH.unflatten(0, (-1, seq_len)))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


class NpuFusedAttention(Module):
    """Inner attention over packed documents: NPU fused kernel, or plain-torch reference."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        dropout: float = 0.0
        """Attention-probability dropout while training (torch_npu ``keep_prob = 1 - dropout``)."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        if tuple(config.window_size) != (-1, 0):
            raise NotImplementedError(
                f"NpuFusedAttention supports causal attention only, got window_size={config.window_size}"
            )
        self.dropout = config.dropout

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: VarlenMetadata,
        scale: float | None = None,
        kernels: NpuKernels | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``kernels`` defaults to torch_npu's for NPU tensors, else the reference path runs."""
        if not isinstance(attention_masks, VarlenMetadata):
            raise TypeError(f"attention_masks must be VarlenMetadata, got {type(attention_masks).__name__}")
        if kwargs.get("out_transform") is not None:
            raise NotImplementedError("NpuFusedAttention does not support out_transform")
        batch, seq_len = q_BLNH.shape[:2]
        doc_ends = document_ends(host_offsets(attention_masks), batch, seq_len)
        dropout = self.dropout if self.training else 0.0
        kernels = select_kernels(kernels, q_BLNH, k_BLNH, v_BLNH)
        if kernels is None:
            return reference_attention(q_BLNH, k_BLNH, v_BLNH, doc_ends, scale=scale, dropout=dropout)
        return npu_attention(q_BLNH, k_BLNH, v_BLNH, doc_ends, scale=scale, dropout=dropout, kernels=kernels)


@override(
    target=FlexAttention.Config,
    exact=True,
    description="Packed-document causal attention: npu_fusion_attention (TND) on NPU, per-document SDPA elsewhere.",
)
def npu_fused_attention(cfg: FlexAttention.Config) -> NpuFusedAttention.Config:
    use_host_tables()  # the decoder's metadata from the data loader's host tables, when its batches carry them
    return derive(cfg, NpuFusedAttention.Config)
