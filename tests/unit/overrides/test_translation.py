"""Argument translation for the torch_npu kernels, asserted directly (no NPU needed)."""

import math

import pytest
import torch
from torchtitan.models.common.attention import VarlenMetadata, create_varlen_metadata_for_document

from slurm_titan.overrides.attention_args import (
    compressed_causal_mask,
    document_ends,
    fusion_attention_kwargs,
    host_offsets,
    softmax_scale,
    varlen_calls,
)
from slurm_titan.overrides.kernel_models import MODEL_KERNELS
from slurm_titan.overrides.kernels import NpuKernels, select_kernels
from slurm_titan.overrides.npu_attention import npu_attention
from slurm_titan.overrides.npu_norm import rms_norm_npu
from slurm_titan.overrides.npu_rope import fold_batch, interleave_rotation_tables
from slurm_titan.overrides.reference_attention import reference_attention


def _positions(*rows: list[int]) -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])


def test_document_ends_from_torchtitan_metadata():
    metadata = create_varlen_metadata_for_document(_positions([3, 5], [8]))
    assert metadata.cu_seq_q.tolist() == [0, 3, 8, 16]  # starts plus total
    assert document_ends(metadata.cu_seq_q.tolist(), batch=2, seq_len=8) == [3, 8, 16]


def test_document_ends_never_cross_rows():
    # Row 1 does not start with position 0: its head must not continue row 0's last document.
    assert document_ends([0, 3, 10, 16], batch=2, seq_len=8) == [3, 8, 10, 16]


def test_document_ends_rejects_offsets_beyond_the_batch():
    with pytest.raises(ValueError):
        document_ends([0, 20], batch=2, seq_len=8)


def test_fusion_attention_kwargs():
    kwargs = fusion_attention_kwargs(
        n_heads=8, head_dim=64, doc_ends=[3, 8, 16], scale=None, dropout=0.1, device=torch.device("cpu")
    )
    mask = kwargs.pop("atten_mask")
    assert kwargs == {
        "head_num": 8,
        "input_layout": "TND",
        "scale": 1 / math.sqrt(64),
        "keep_prob": pytest.approx(0.9),
        "pre_tockens": 2147483647,
        "next_tockens": 0,
        "sparse_mode": 3,
        "actual_seq_qlen": [3, 8, 16],
        "actual_seq_kvlen": [3, 8, 16],
    }
    # Compressed causal mask: True (masked out) strictly above the diagonal.
    assert mask.shape == (2048, 2048) and mask.dtype == torch.bool
    assert not mask[5, 5] and not mask[5, 0] and mask[5, 6]


def test_explicit_scale_and_dropout_bounds():
    assert softmax_scale(0.5, head_dim=64) == 0.5
    assert softmax_scale(None, head_dim=16) == 0.25
    with pytest.raises(ValueError):
        fusion_attention_kwargs(
            n_heads=1, head_dim=8, doc_ends=[4], scale=None, dropout=1.0, device=torch.device("cpu")
        )


def test_npu_attention_passes_tnd_layout():
    seen = {}

    def recording_attention(query, key, value, head_num, input_layout, **kwargs):
        seen.update(q=query.shape, k=key.shape, v=value.shape, head_num=head_num, layout=input_layout)
        return MODEL_KERNELS.npu_fusion_attention(query, key, value, head_num, input_layout, **kwargs)

    kernels = NpuKernels(recording_attention, MODEL_KERNELS.npu_rotary_mul, MODEL_KERNELS.npu_rms_norm)
    q, k, v = torch.randn(2, 8, 4, 16), torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    out = npu_attention(q, k, v, [3, 8, 16], scale=None, dropout=0.0, kernels=kernels)
    assert seen == dict(q=(16, 4, 16), k=(16, 2, 16), v=(16, 2, 16), head_num=4, layout="TND")
    assert out.shape == (2, 8, 4, 16)


def test_npu_attention_depends_on_document_boundaries():
    q, k, v = torch.randn(1, 12, 2, 8), torch.randn(1, 12, 2, 8), torch.randn(1, 12, 2, 8)
    per_doc = npu_attention(q, k, v, [5, 12], scale=None, dropout=0.0, kernels=MODEL_KERNELS)
    one_doc = npu_attention(q, k, v, [12], scale=None, dropout=0.0, kernels=MODEL_KERNELS)
    torch.testing.assert_close(per_doc[:, :5], one_doc[:, :5])  # first document: same causal prefix
    assert not torch.allclose(per_doc[:, 5:], one_doc[:, 5:])  # second must not see the first


def test_host_offsets_prefers_host_copy_and_caches_per_metadata():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    assert host_offsets(VarlenMetadata(cu, cu, 5, 5, (0, 3, 8))) == (0, 3, 8)
    metadata = VarlenMetadata(cu, cu, 5, 5)
    assert host_offsets(metadata) == (0, 3, 8)
    cu[1] = 4  # same tensor: served from the cache, no new device-to-host copy
    assert host_offsets(metadata) == (0, 3, 8)
    fresh = cu.clone()
    assert host_offsets(VarlenMetadata(fresh, fresh, 5, 5)) == (0, 4, 8)


def test_rope_batch_fold_and_tables():
    x = torch.arange(12.0).view(2, 3, 1, 2)
    assert fold_batch(x).shape == (1, 6, 1, 2) and fold_batch(x).flatten().tolist() == x.flatten().tolist()
    cos, sin = torch.tensor([[0.1, 0.2]] * 3).cos(), torch.tensor([[0.1, 0.2]] * 3).sin()
    r1, r2 = interleave_rotation_tables(cos, sin)
    assert torch.equal(r1[0], cos[0].repeat_interleave(2)) and torch.equal(r2[0], sin[0].repeat_interleave(2))


def test_rms_norm_casts_gamma_to_input_dtype():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    out = rms_norm_npu(x, torch.ones(8), 1e-5, MODEL_KERNELS)  # fp32 weight: the model requires the cast
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(rms_norm_npu(x, None, 1e-5, MODEL_KERNELS), out)


def test_select_kernels():
    cpu = torch.zeros(2)
    assert select_kernels(None, cpu, None) is None
    assert select_kernels(MODEL_KERNELS, cpu) is MODEL_KERNELS
    assert select_kernels(None) is None


def test_varlen_calls_one_for_the_batch_within_the_limits():
    assert varlen_calls([3, 8, 16], batch=2, seq_len=8) == [(slice(0, 2), [3, 8, 16])]


def test_varlen_calls_split_per_row_beyond_1024_documents():
    one_token_docs = list(range(1, 1025))  # row 0: 1024 documents of one token
    ends = one_token_docs + [1024 + 512, 2048]  # row 1: two documents
    assert varlen_calls(ends, batch=2, seq_len=1024) == [(slice(0, 1), one_token_docs), (slice(1, 2), [512, 1024])]


def test_varlen_calls_split_per_row_beyond_2_to_the_20_tokens():
    seq_len = 2**19
    ends = [seq_len * (i + 1) for i in range(3)]
    assert varlen_calls(ends, batch=3, seq_len=seq_len) == [(slice(i, i + 1), [seq_len]) for i in range(3)]


def test_varlen_calls_refuse_a_row_beyond_the_limits():
    with pytest.raises(ValueError, match="batch row 0 holds 1025 documents in 1025 tokens.*at most 1024"):
        varlen_calls(list(range(1, 1026)), batch=1, seq_len=1025)


def test_npu_attention_splits_a_batch_beyond_the_limits_into_rows(monkeypatch):
    calls = []

    def recording_attention(query, key, value, head_num, input_layout, **kwargs):
        calls.append((query.shape[0], kwargs["actual_seq_qlen"]))
        return MODEL_KERNELS.npu_fusion_attention(query, key, value, head_num, input_layout, **kwargs)

    kernels = NpuKernels(recording_attention, MODEL_KERNELS.npu_rotary_mul, MODEL_KERNELS.npu_rms_norm)
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 2, 8), torch.randn(2, 8, 1, 8), torch.randn(2, 8, 1, 8)
    whole = npu_attention(q, k, v, [3, 8, 10, 16], scale=None, dropout=0.0, kernels=kernels)
    monkeypatch.setattr("slurm_titan.overrides.attention_args.VARLEN_MAX_SEQUENCES", 3)
    split = npu_attention(q, k, v, [3, 8, 10, 16], scale=None, dropout=0.0, kernels=kernels)
    assert calls == [(16, [3, 8, 10, 16]), (8, [3, 8]), (8, [2, 8])]
    torch.testing.assert_close(split, whole)


def test_compressed_mask_is_built_on_the_cpu_and_copied(monkeypatch):
    devices = []
    triu = torch.triu
    monkeypatch.setattr(torch, "triu", lambda x, **kw: devices.append(x.device) or triu(x, **kw))
    compressed_causal_mask.cache_clear()
    assert compressed_causal_mask(torch.device("meta")).device == torch.device("meta")
    assert devices == [torch.device("cpu")]
    compressed_causal_mask.cache_clear()


def test_npu_attention_over_1024_documents_in_a_batch_fits_the_kernel_contract():
    # Row 0: 1024 one-token documents; row 1: 6 documents. One call would pass 1030 sequences.
    row1 = [100, 200, 300, 400, 500, 1024]
    ends = list(range(1, 1025)) + [1024 + e for e in row1]
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 1024, 2, 8), torch.randn(2, 1024, 1, 8), torch.randn(2, 1024, 1, 8)
    out = npu_attention(q, k, v, ends, scale=None, dropout=0.0, kernels=MODEL_KERNELS)
    torch.testing.assert_close(out, reference_attention(q, k, v, ends, scale=None, dropout=0.0))
