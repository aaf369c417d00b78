"""Plain-torch per-document causal attention: the non-NPU path of the attention override.

torchtitan packs several documents into each row and masks attention so a
token only sees earlier tokens of its own document. FlexAttention has no CPU
backward and a causal SDPA over the whole row would let documents see each
other, so this runs one causal SDPA per document: the same masking, autograd
support, and only ``sum(len_i**2)`` work instead of ``seq_len**2`` per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from slurm_titan.overrides.attention_args import softmax_scale


def reference_attention(
    q_BLNH: torch.Tensor,
    k_BLNH: torch.Tensor,
    v_BLNH: torch.Tensor,
    doc_ends: Sequence[int],
    *,
    scale: float | None,
    dropout: float,
) -> torch.Tensor:
    """Causal attention within each packed document; returns ``(B, L, Nq, Hv)``.

    ``doc_ends`` are the cumulative document end offsets over the flattened
    ``B * L`` tokens (see :func:`.attention_args.document_ends`). Key/value may
    have fewer heads than query (GQA).
    """
    batch, seq_len, n_heads, head_dim = q_BLNH.shape
    lengths = [end - start for start, end in zip([0, *doc_ends[:-1]], doc_ends, strict=True)]
    # (1, N, T, H) over all packed tokens, cut into documents. split (not slicing)
    # keeps the backward a single concatenation instead of one full-size
    # zero-filled gradient per document.
    q_docs, k_docs, v_docs = (
        x.flatten(0, 1).transpose(0, 1).unsqueeze(0).contiguous().split(lengths, dim=-2)
        for x in (q_BLNH, k_BLNH, v_BLNH)
    )
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=dropout,
                is_causal=True,
                scale=softmax_scale(scale, head_dim),
                enable_gqa=k.shape[1] != n_heads,
            )
            for q, k, v in zip(q_docs, k_docs, v_docs, strict=True)
        ],
        dim=-2,
    )
    return out.squeeze(0).transpose(0, 1).unflatten(0, (batch, seq_len))
