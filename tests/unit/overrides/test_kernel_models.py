"""The executable torch_npu contract models agree with the documented semantics and reject misuse."""

import pytest
import torch
import torch.nn.functional as F

from slurm_titan.overrides.attention_args import compressed_causal_mask
from slurm_titan.overrides.kernel_models import (
    npu_fusion_attention_model,
    npu_rms_norm_model,
    npu_rotary_mul_model,
)

CPU = torch.device("cpu")


def _block_causal(doc_lengths: list[int]) -> torch.Tensor:
    """(S, S) mask, True = masked: causal within each document, nothing across documents."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lengths)), torch.tensor(doc_lengths))
    allowed = (doc[:, None] == doc[None, :]) & torch.ones(len(doc), len(doc), dtype=torch.bool).tril()
    return ~allowed


def test_tnd_causal_equals_explicit_block_causal_masks_in_every_layout():
    torch.manual_seed(0)
    lengths = [5, 7, 4]
    q, k, v = torch.randn(16, 4, 8), torch.randn(16, 2, 8), torch.randn(16, 2, 8)
    tnd = npu_fusion_attention_model(
        q,
        k,
        v,
        4,
        "TND",
        atten_mask=compressed_causal_mask(CPU),
        scale=0.3,
        actual_seq_qlen=[5, 12, 16],
        actual_seq_kvlen=[5, 12, 16],
        sparse_mode=3,
    )[0]
    mask = _block_causal(lengths)
    bsnd = npu_fusion_attention_model(
        q[None], k[None], v[None], 4, "BSND", atten_mask=mask[None, None], scale=0.3, sparse_mode=1
    )[0][0]
    bnsd = npu_fusion_attention_model(
        *(x.transpose(0, 1)[None] for x in (q, k, v)), 4, "BNSD", atten_mask=mask, scale=0.3
    )[0][0].transpose(0, 1)
    torch.testing.assert_close(tnd, bsnd)
    torch.testing.assert_close(tnd, bnsd)


def test_gqa_groups_consecutive_query_heads():
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
    out = npu_fusion_attention_model(q, k, v, 2, "BNSD")[0]
    expected = F.scaled_dot_product_attention(q, k.expand(1, 2, 6, 8), v.expand(1, 2, 6, 8), scale=1.0)
    torch.testing.assert_close(out, expected)  # also: default scale is 1.0, no mask means full attention


def test_sparse_mode_0_band_from_pre_and_next_tokens():
    q, k, v = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    no_mask = torch.zeros(6, 6, dtype=torch.bool)
    banded = npu_fusion_attention_model(q, k, v, 1, "BNSD", atten_mask=no_mask, pre_tockens=1, next_tockens=0)[0]
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    explicit = npu_fusion_attention_model(q, k, v, 1, "BNSD", atten_mask=(j > i) | (j < i - 1), sparse_mode=1)[0]
    torch.testing.assert_close(banded, explicit)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"atten_mask": torch.ones(2048, 2048, dtype=torch.bool).tril()}, "compressed"),
        ({"actual_seq_qlen": [4, 7], "actual_seq_kvlen": [4, 7]}, "ending at T"),
        ({"head_num": 3}, "head_num"),
        ({"keep_prob": 0.0}, "keep_prob"),
        ({"value": torch.randn(8, 2, 8, dtype=torch.bfloat16)}, "share a dtype"),
        ({"query": torch.randn(8, 4, 776), "key": torch.randn(8, 2, 776), "value": torch.randn(8, 2, 776)}, "768"),
        ({"head_num": 512, "query": torch.randn(8, 512, 8)}, "at most 256"),
        ({"actual_seq_qlen": list(range(1, 1025)) + [8], "actual_seq_kvlen": [4, 8]}, "at most 1024"),
    ],
)
def test_fusion_attention_model_rejects_contract_violations(change, message):
    q, kv = torch.randn(8, 4, 8), torch.randn(8, 2, 8)
    change = {"query": q, "key": kv, "value": kv} | change
    kwargs = (
        dict(
            head_num=4,
            input_layout="TND",
            atten_mask=compressed_causal_mask(CPU),
            actual_seq_qlen=[4, 8],
            actual_seq_kvlen=[4, 8],
            sparse_mode=3,
        )
        | change
    )
    with pytest.raises(ValueError, match=message):
        npu_fusion_attention_model(**kwargs)


def test_fusion_attention_model_varlen_limits():
    q = torch.zeros(2**20 + 1, 1, 8)
    tnd = dict(head_num=1, input_layout="TND", atten_mask=compressed_causal_mask(CPU), sparse_mode=3)
    with pytest.raises(ValueError, match="1048576 tokens"):
        npu_fusion_attention_model(q, q, q, **tnd, actual_seq_qlen=[q.shape[0]], actual_seq_kvlen=[q.shape[0]])
    q = torch.randn(1024, 1, 8)
    ends = list(range(1, 1025))  # 1024 one-token sequences: the most one call takes
    assert npu_fusion_attention_model(q, q, q, **tnd, actual_seq_qlen=ends, actual_seq_kvlen=ends)[0].shape == q.shape


def test_fusion_attention_model_takes_int_lists_not_tensors():
    q = torch.randn(8, 1, 8)
    tnd = dict(head_num=1, input_layout="TND", atten_mask=compressed_causal_mask(CPU), sparse_mode=3)
    with pytest.raises(TypeError, match="int"):
        npu_fusion_attention_model(q, q, q, **tnd, actual_seq_qlen=torch.tensor([4, 8]), actual_seq_kvlen=[4, 8])


def test_fusion_attention_model_rejects_fully_masked_rows_and_unmodelled_inputs():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="whole row"):
        npu_fusion_attention_model(q, q, q, 1, "BNSD", atten_mask=torch.ones(4, 4, dtype=torch.bool), sparse_mode=1)
    with pytest.raises(NotImplementedError):
        npu_fusion_attention_model(q, q, q, 1, "SBH")
    with pytest.raises(NotImplementedError):
        npu_fusion_attention_model(q, q, q, 1, "BNSD", atten_mask=compressed_causal_mask(CPU), sparse_mode=4)


def test_rotary_mul_model_half_and_interleave_modes():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4)
    r1, r2 = torch.full_like(x, 0.5), torch.full_like(x, 0.25)
    # half: r1 * x + r2 * cat(-x2, x1) with x1 = [1, 2], x2 = [3, 4]
    assert npu_rotary_mul_model(x, r1, r2).flatten().tolist() == [0.5 - 0.75, 1 - 1, 1.5 + 0.25, 2 + 0.5]
    # interleave: pairs (1, 2), (3, 4) -> (-2, 1), (-4, 3)
    out = npu_rotary_mul_model(x, r1, r2, rotary_mode="interleave")
    assert out.flatten().tolist() == [0.5 - 0.5, 1 + 0.25, 1.5 - 1, 2 + 0.75]
    with pytest.raises(NotImplementedError):
        npu_rotary_mul_model(x, r1, r2, rotary_mode="quarter")


def test_interleave_mode_is_upstream_complex_rope():
    torch.manual_seed(0)
    x, angles = torch.randn(1, 6, 3, 8), torch.rand(1, 6, 1, 4) * 6
    rotated = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (4, 2))) * torch.polar(torch.ones(()), angles))
    r1, r2 = (t.repeat_interleave(2, dim=-1) for t in (angles.cos(), angles.sin()))
    torch.testing.assert_close(npu_rotary_mul_model(x, r1, r2, rotary_mode="interleave"), rotated.flatten(-2))


@pytest.mark.parametrize(
    "shape, table, mode, ok",
    [
        ((2, 6, 3, 8), (1, 6, 1, 8), "interleave", True),  # BSND with 1S1D
        ((2, 6, 3, 8), (2, 6, 1, 8), "interleave", False),  # BS1D: half mode only
        ((2, 6, 3, 8), (2, 6, 1, 8), "half", True),
        ((2, 6, 3, 8), (2, 6, 3, 8), "half", True),
        ((2, 6, 3, 8), (1, 6, 3, 8), "half", False),  # no layout keeps dims 1 and 2 but not 0
        ((1, 6, 1000, 8), (1, 6, 1, 8), "half", False),  # N < 1000
        ((2, 6, 500, 8), (1, 6, 1, 8), "interleave", False),  # B * N < 1000
    ],
)
def test_rotary_mul_model_table_layouts(shape, table, mode, ok):
    x, r = torch.zeros(shape), torch.zeros(table)
    if ok:
        npu_rotary_mul_model(x, r, r, rotary_mode=mode)
    else:
        with pytest.raises(ValueError, match="does not take"):
            npu_rotary_mul_model(x, r, r, rotary_mode=mode)


def test_rotary_mul_model_tables_lie_in_minus_one_one():
    x = torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        npu_rotary_mul_model(x, torch.full((1, 2, 1, 4), 1.5), torch.zeros(1, 2, 1, 4))


def test_rms_norm_model():
    x = torch.tensor([[3.0, 4.0]])
    y, rstd = npu_rms_norm_model(x, torch.tensor([1.0, 2.0]), epsilon=0.0)
    rms = (12.5) ** 0.5
    torch.testing.assert_close(rstd, torch.tensor([[1 / rms]]))
    torch.testing.assert_close(y, torch.tensor([[3 / rms, 8 / rms]]))
    with pytest.raises(ValueError, match="dtype"):
        npu_rms_norm_model(x, torch.ones(2, dtype=torch.bfloat16))
