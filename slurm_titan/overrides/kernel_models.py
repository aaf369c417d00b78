"""Executable plain-torch models of the documented torch_npu kernel contracts.

They stand in for ``torch_npu`` (see :data:`MODEL_KERNELS`) so the NPU code
paths can be run and differentiated on CPU. Sources: torch_npu 2.14.0's
docstrings (``torch_npu/_op_plugin_docs.py``) and Ascend/op-plugin
``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md``,
``torch_npu-npu_rotary_mul.md`` and ``（beta）torch_npu-npu_rms_norm.md`` (also
on hiascend.com, "Ascend Extension for PyTorch" API reference).

The models implement what the overrides use and are strict about it: an
argument outside the modelled subset raises ``NotImplementedError``, a
documented precondition that is violated raises ``ValueError`` (``TypeError``
for an argument of the wrong type, e.g. a tensor where the schema says
``int[]``), so a wrong translation fails loudly instead of being quietly
reinterpreted. They do not model devices, memory formats or precision: run
them under :class:`.npu_capabilities.RefuseAscendUnsupported` to refuse the ops
Ascend lacks. On meta tensors (a shape-only run: ``check-overrides``' model-sized
cases) they check every shape, dtype and layout precondition and skip the two
that read values (the compressed mask's content, the rotary tables' range).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from slurm_titan.overrides.kernels import NpuKernels
from slurm_titan.overrides.npu_capabilities import (
    FUSION_ATTENTION_MAX_HEAD_DIM,
    FUSION_ATTENTION_MAX_HEADS,
    VARLEN_MAX_SEQUENCES,
    VARLEN_MAX_TOKENS,
)

_COMPRESSED_MASK_SIZE = 2048


def npu_fusion_attention_model(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
) -> tuple[Any, ...]:
    """``torch_npu.npu_fusion_attention``: ``softmax(scale * Q K^T, masked) V`` per sequence.

    Modelled: layouts BNSD, BSND and TND (varlen, cumulative
    ``actual_seq_*len``); GQA (query head ``h`` reads key/value head
    ``h // (Nq / Nkv)``); ``atten_mask`` True = masked out, shapes
    BNSS/B1SS/11SS/SS (TND: SS only); sparse modes 0 (mask plus the
    ``pre_tockens``/``next_tockens`` band), 1 (mask as given), 2 (leftUpCausal)
    and 3 (rightDownCausal), the latter two requiring the compressed 2048x2048
    mask; ``keep_prob`` dropout. Scores are computed in fp32. Only output
    ``[0]`` (attention_out, in the input layout and dtype) is modelled; the
    softmax statistics and dropout seed/offset/length are returned as ``None``/0.
    ``inner_precise``, ``gen_mask_parallel`` and ``sync`` only affect precision
    and scheduling on the device; they are accepted and ignored. Documented
    limits: query, key and value of one dtype; D <= 768; Nq <= 256; TND at
    most 1024 sequences and 2**20 tokens per call.
    """
    if pse is not None or padding_mask is not None or prefix is not None:
        raise NotImplementedError("pse, padding_mask and prefix are not modelled")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob must be in (0, 1], got {keep_prob}")
    if key.shape[:-1] != value.shape[:-1] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"shape mismatch: query {query.shape}, key {key.shape}, value {value.shape}")
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.shape[-1] > FUSION_ATTENTION_MAX_HEAD_DIM:
        raise ValueError(f"head dim {query.shape[-1]} exceeds {FUSION_ATTENTION_MAX_HEAD_DIM}")
    seqs_q, seqs_k, seqs_v, merge = _split_sequences(query, key, value, input_layout, actual_seq_qlen, actual_seq_kvlen)
    n_q, n_kv = seqs_q[0].shape[0], seqs_k[0].shape[0]
    if n_q != head_num or n_q % n_kv or n_q > FUSION_ATTENTION_MAX_HEADS:
        raise ValueError(
            f"head_num={head_num} with {n_q} query and {n_kv} key/value heads (at most {FUSION_ATTENTION_MAX_HEADS})"
        )
    if atten_mask is not None:
        _check_mask(atten_mask, sparse_mode)  # once a call: the same mask serves every sequence
    outs = []
    for index, (q, k, v) in enumerate(zip(seqs_q, seqs_k, seqs_v, strict=True)):
        mask = _sequence_mask(
            atten_mask, input_layout, index, q.shape[1], k.shape[1], sparse_mode, pre_tockens, next_tockens
        )
        k, v = (x.repeat_interleave(n_q // n_kv, dim=0) for x in (k, v))
        scores = scale * (q.float() @ k.float().transpose(-1, -2))
        if mask is not None:
            if not mask.is_meta and mask.all(dim=-1).any():
                raise ValueError("atten_mask masks a whole row, which torch_npu does not support")
            scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if keep_prob < 1.0:
            probs = F.dropout(probs, p=1.0 - keep_prob)
        outs.append((probs @ v.float()).to(query.dtype))
    return merge(outs), None, None, None, 0, 0, 0


def _split_sequences(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: str,
    actual_seq_qlen: Sequence[int] | None,
    actual_seq_kvlen: Sequence[int] | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], Any]:
    """Per-sequence ``(N, S, D)`` views of q/k/v, and how to merge ``(N, Sq, Dv)`` outputs back."""
    if layout in ("BNSD", "BSND"):
        if actual_seq_qlen is not None or actual_seq_kvlen is not None:
            raise ValueError("actual_seq_qlen/actual_seq_kvlen are for the TND layout only")
        to_bnsd = (lambda x: x) if layout == "BNSD" else (lambda x: x.transpose(1, 2))
        q, k, v = (list(to_bnsd(x).unbind(0)) for x in (query, key, value))
        return q, k, v, lambda outs: to_bnsd(torch.stack(outs))
    if layout == "TND":
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError("TND needs actual_seq_qlen and actual_seq_kvlen")
        if not 1 <= query.shape[0] <= VARLEN_MAX_TOKENS or not 1 <= key.shape[0] <= VARLEN_MAX_TOKENS:
            raise ValueError(f"TND takes 1 to {VARLEN_MAX_TOKENS} tokens, got {query.shape[0]} and {key.shape[0]}")
        q_bounds = _segments(actual_seq_qlen, query.shape[0], "actual_seq_qlen")
        kv_bounds = _segments(actual_seq_kvlen, key.shape[0], "actual_seq_kvlen")
        if len(q_bounds) != len(kv_bounds):
            raise ValueError("actual_seq_qlen and actual_seq_kvlen differ in length")
        q = [query[s:e].transpose(0, 1) for s, e in q_bounds]
        k, v = ([x[s:e].transpose(0, 1) for s, e in kv_bounds] for x in (key, value))
        return q, k, v, lambda outs: torch.cat([o.transpose(0, 1) for o in outs])
    raise NotImplementedError(f"input_layout {layout!r} is not modelled")


def _segments(cumulative: Sequence[int], total: int, name: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sequence from cumulative end offsets that must cover all tokens."""
    if isinstance(cumulative, torch.Tensor) or not all(isinstance(e, int) for e in cumulative):
        raise TypeError(f"{name} must be a sequence of ints (schema int[]), got {cumulative!r}")
    if len(cumulative) > VARLEN_MAX_SEQUENCES:
        raise ValueError(f"{name} holds {len(cumulative)} sequences; TND takes at most {VARLEN_MAX_SEQUENCES}")
    ends = list(cumulative)
    starts = [0, *ends[:-1]]
    if not ends or any(e < s for s, e in zip(starts, ends, strict=True)) or ends[-1] != total:
        raise ValueError(f"{name}={ends} must be non-decreasing cumulative lengths ending at T={total}")
    return list(zip(starts, ends, strict=True))


def _sequence_mask(
    atten_mask: torch.Tensor | None,
    layout: str,
    index: int,
    s_q: int,
    s_kv: int,
    sparse_mode: int,
    pre_tockens: int,
    next_tockens: int,
) -> torch.Tensor | None:
    """The effective ``(N or 1, Sq, Skv)`` mask (True = masked) of sequence ``index`` (``atten_mask`` checked by
    :func:`_check_mask`)."""
    if atten_mask is None:
        return None  # documented: no mask means full attention, whatever sparse_mode says
    q_idx = torch.arange(s_q, device=atten_mask.device)[:, None]
    kv_idx = torch.arange(s_kv, device=atten_mask.device)[None, :]
    if sparse_mode in (2, 3):
        offset = 0 if sparse_mode == 2 else s_kv - s_q
        return (kv_idx > q_idx + offset).unsqueeze(0)
    if sparse_mode not in (0, 1):
        raise NotImplementedError(f"sparse_mode {sparse_mode} is not modelled")
    given = _given_mask(atten_mask.bool(), layout, index, s_q, s_kv)
    if sparse_mode == 1:
        return given
    band = (kv_idx > q_idx + next_tockens) | (kv_idx < q_idx - pre_tockens)
    return given | band


def _given_mask(mask: torch.Tensor, layout: str, index: int, s_q: int, s_kv: int) -> torch.Tensor:
    """Slice an explicit mask down to sequence ``index``: ``(N or 1, Sq, Skv)``."""
    if layout == "TND":
        if mask.dim() != 2:
            raise ValueError(f"TND takes an SS (maxSq, maxSkv) atten_mask, got shape {tuple(mask.shape)}")
        return mask[:s_q, :s_kv].unsqueeze(0)
    if mask.dim() == 2:
        return mask.unsqueeze(0)
    if mask.dim() == 4:
        return mask[index if mask.shape[0] > 1 else 0]
    raise ValueError(f"atten_mask must be SS, 11SS, B1SS or BNSS, got shape {tuple(mask.shape)}")


def _check_mask(mask: torch.Tensor, sparse_mode: int) -> None:
    """ValueError unless ``mask`` is bool or uint8 and, in sparse modes 2 and 3, the compressed causal mask."""
    if mask.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"atten_mask must be bool or uint8, got {mask.dtype}")
    if sparse_mode not in (2, 3):
        return
    expected = torch.triu(
        torch.ones(_COMPRESSED_MASK_SIZE, _COMPRESSED_MASK_SIZE, dtype=torch.bool, device=mask.device),
        diagonal=1,
    )
    if mask.shape != expected.shape or not (mask.is_meta or torch.equal(mask.bool(), expected)):
        raise ValueError(f"sparse_mode {sparse_mode} needs the compressed 2048x2048 upper-triangular atten_mask")


_ROTARY_LAYOUTS = ("BNSD", "BSND", "SBND")
_ROTARY_TABLES = {"half": ("S", "BS", "BSN"), "interleave": ("S",)}
"""Per mode, the input dims (besides D) an ``r1``/``r2`` table keeps: ``half`` takes
e.g. 1S1D, BS1D, BSND for BSND input; ``interleave`` only 1S1D (11SD for BNSD, S11D for SBND)."""


def npu_rotary_mul_model(
    input: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
) -> torch.Tensor:
    """``torch_npu.npu_rotary_mul``: ``r1 * x + r2 * rotate(x)`` on 4-D tensors.

    ``half``: ``rotate(x) = cat(-x2, x1)`` over the halves of the last dim.
    ``interleave``: ``rotate(x)`` maps each pair ``(x[2i], x[2i+1])`` to
    ``(-x[2i+1], x[2i])``. Limits (jit_compile=False, A2/A3): D even and < 896;
    ``half``: B, N < 1000; ``interleave``: B * N < 1000; tables in [-1, 1] of
    a shape :data:`_ROTARY_TABLES` allows for one of the layouts BNSD, BSND, SBND.
    """
    if rotary_mode not in _ROTARY_TABLES:
        raise NotImplementedError(f"rotary_mode {rotary_mode!r} is not modelled")
    if input.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        raise ValueError("npu_rotary_mul takes 4-D input, r1 and r2")
    if input.shape[-1] % 2 or input.shape[-1] >= 896:
        raise ValueError(f"head dim must be even and < 896, got {input.shape[-1]}")
    if r1.shape != r2.shape or not _rotary_table_fits(input.shape, r1.shape, rotary_mode):
        raise ValueError(f"{rotary_mode} mode does not take r1 {tuple(r1.shape)}, r2 {tuple(r2.shape)} "
                         f"for input {tuple(input.shape)}")
    if not r1.is_meta and (r1.abs().max() > 1 or r2.abs().max() > 1):
        raise ValueError("r1 and r2 must lie in [-1, 1]")
    if rotary_mode == "half":
        x1, x2 = torch.chunk(input, 2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        rotated = torch.stack((-input[..., 1::2], input[..., ::2]), dim=-1).flatten(-2)
    return r1 * input + r2 * rotated


def _rotary_table_fits(shape: torch.Size, table: torch.Size, mode: str) -> bool:
    """Whether ``table`` is an allowed ``r1``/``r2`` shape for ``shape`` under some layout, within its B, N limits."""
    for layout in _ROTARY_LAYOUTS:
        sizes = dict(zip(layout[:3], shape[:3], strict=True))
        b_n_ok = sizes["B"] * sizes["N"] < 1000 if mode == "interleave" else max(sizes["B"], sizes["N"]) < 1000
        for kept in _ROTARY_TABLES[mode]:
            expected = (*(sizes[d] if d in kept else 1 for d in layout[:3]), shape[3])
            if b_n_ok and tuple(table) == expected:
                return True
    return False


def npu_rms_norm_model(
    input: torch.Tensor,
    gamma: torch.Tensor,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_rms_norm``: ``(x * rstd * gamma, rstd)`` over gamma's trailing dims, in fp32."""
    if gamma.dtype != input.dtype:
        raise ValueError(f"gamma dtype {gamma.dtype} must equal input dtype {input.dtype}")
    dims = tuple(range(-gamma.dim(), 0))
    x = input.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.float()).to(input.dtype), rstd


MODEL_KERNELS = NpuKernels(
    npu_fusion_attention=npu_fusion_attention_model,
    npu_rotary_mul=npu_rotary_mul_model,
    npu_rms_norm=npu_rms_norm_model,
)
"""The contract models bundled like :func:`.kernels.torch_npu_kernels`, for CPU runs of the NPU paths."""
