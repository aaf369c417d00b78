"""The RoPE override's NPU path: real-valued cache lookup, interleave mode at every batch, upstream fallback."""

import pytest
import torch
from torchtitan.models.common.rope import ComplexRoPE

import slurm_titan.overrides.npu_rope as npu_rope
from slurm_titan.overrides.kernel_models import MODEL_KERNELS
from slurm_titan.overrides.kernels import NpuKernels
from slurm_titan.overrides.npu_capabilities import AscendUnsupportedError, RefuseAscendUnsupported
from slurm_titan.overrides.npu_rope import npu_rotary_rope

CFG = ComplexRoPE.Config(dim=16, max_seq_len=64, theta=500000, scaling="llama")
DOCS = (10, 1, 20, 33)  # per-document positions reset to 0 at every document start


def _inputs(batch: int):
    torch.manual_seed(batch)
    positions = torch.cat([torch.arange(n) for n in DOCS]).repeat(batch, 1)
    positions[-1] = torch.cat([torch.arange(40), torch.arange(24)])  # rows differ when batch > 1
    return torch.randn(batch, 64, 4, 16, dtype=torch.bfloat16), torch.randn(batch, 64, 2, 16), positions


def _modes_seen() -> tuple[list[str], NpuKernels]:
    seen: list[str] = []

    def rotary(x, r1, r2, rotary_mode="half"):
        seen.append(rotary_mode)
        return MODEL_KERNELS.npu_rotary_mul(x, r1, r2, rotary_mode)

    return seen, NpuKernels(MODEL_KERNELS.npu_fusion_attention, rotary, MODEL_KERNELS.npu_rms_norm)


@pytest.mark.parametrize("batch", [1, 3])
def test_npu_path_indexes_no_complex_tensor_and_matches_upstream(batch):
    upstream, override = CFG.build(), npu_rotary_rope(CFG).build()
    q, k, positions = _inputs(batch)
    seen, kernels = _modes_seen()
    with RefuseAscendUnsupported():
        out = override(q, k, positions, kernels=kernels)
    assert seen == ["interleave", "interleave"]  # no de- and re-interleaving of the head dim at batch > 1
    for actual, expected in zip(out, upstream(q, k, positions), strict=True):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6 if actual.dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_old_lookup_through_upstreams_reshape_cache_is_refused(batch):
    # Before the fix the NPU path took upstream's complex64 lookup (index at batch 1, gather above).
    override = npu_rotary_rope(CFG).build()
    q, _, positions = _inputs(batch)
    op = "index.Tensor" if batch == 1 else "gather"
    with RefuseAscendUnsupported(), pytest.raises(AscendUnsupportedError, match=op):
        override._reshape_cache(q, positions)


def test_rotation_angles_equal_upstreams_cache_lookup_bit_for_bit():
    rope = CFG.build()
    for batch in (1, 3):
        q, _, positions = _inputs(batch)
        cache = rope._reshape_cache(q, positions)
        cos, sin = npu_rope.rotation_angles(rope.cache, positions, 64)
        assert torch.equal(cos, cache.real) and torch.equal(sin, cache.imag)
    cos, _ = npu_rope.rotation_angles(rope.cache, None, 10)
    assert torch.equal(cos, rope.cache[:10].real[None, :, None])


def test_a_batch_is_rotated_as_its_rows_one_by_one():
    q, k, positions = _inputs(3)
    cos, sin = npu_rope.rotation_angles(CFG.build().cache, positions, 64)
    batch = npu_rope.rotary_npu(q, k, cos, sin, MODEL_KERNELS)
    for row in range(3):
        one = npu_rope.rotary_npu(q[row:row + 1], k[row:row + 1], cos[row:row + 1], sin[row:row + 1], MODEL_KERNELS)
        for a, b in zip(batch, one, strict=True):
            assert torch.equal(a[row:row + 1], b)
    shared = npu_rope.rotation_angles(CFG.build().cache, None, 64)  # one table for every row
    for a, b in zip(npu_rope.rotary_npu(q, k, *shared, MODEL_KERNELS), CFG.build()(q, k, None), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if a.dtype == torch.float32 else 1e-2)


def test_off_npu_the_override_is_upstream(monkeypatch):
    upstream, override = CFG.build(), npu_rotary_rope(CFG).build()
    q, k, positions = _inputs(2)
    calls = []
    forward = ComplexRoPE.forward
    monkeypatch.setattr(ComplexRoPE, "forward", lambda self, *a: calls.append(a) or forward(self, *a))
    out = override(q, k, positions)
    assert len(calls) == 1  # super().forward, unchanged
    monkeypatch.undo()
    assert all(torch.equal(a, b) for a, b in zip(out, upstream(q, k, positions), strict=True))
