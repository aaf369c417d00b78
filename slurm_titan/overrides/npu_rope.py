"""Override: llama3's ``ComplexRoPE`` applied with ``torch_npu.npu_rotary_mul``.

    --override.imports slurm_titan.overrides.npu_rope.npu_rotary_rope

``ComplexRoPE`` rotates adjacent pairs ``(x[2i], x[2i+1])`` by the angle of
cache entry ``i``. ``npu_rotary_mul(x, r1, r2, rotary_mode)`` computes
``r1 * x + r2 * rotate(x)`` (Ascend/op-plugin
``docs/zh/custom_APIs/torch_npu/torch_npu-npu_rotary_mul.md``; torch_npu
2.14.0 docstring):

* ``interleave``: ``rotate(x)`` pairs ``(x[2i], x[2i+1])`` like torchtitan, so
  ``r1 = repeat_interleave(cos, 2)``, ``r2 = repeat_interleave(sin, 2)``
  rotate ``x`` as it is, with no shuffle of the head dim. For BSND input the
  table must be ``1S1D`` (and B * N < 1000), while per-document positions give
  each batch row its own table (``BS1D``): the batch is folded into the
  sequence, ``(B, S, N, D) -> (1, B*S, N, D)`` (a view), with the table as
  ``1(B*S)1D``; RoPE is per token, so this is the same rotation.

Like upstream, the rotation runs in fp32. torchtitan's cache is complex64, and
Ascend's index/gather kernels have no complex dtypes (:mod:`.npu_capabilities`),
so the positions are looked up in a real view of the cache
(``torch.view_as_real``, no kernel); no complex tensor is indexed on the device.
Upstream's asynchronous bounds check of the positions (``torch._assert_async``,
whose aten kernels are CPU and CUDA ones) is not run on this path.

Tensors off NPU (and DTensors) run upstream ``ComplexRoPE`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.rope import ComplexRoPE

from slurm_titan.overrides.kernels import NpuKernels, select_kernels


def rotation_angles(
    rope_cache: torch.Tensor,
    positions: torch.Tensor | None,
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of every token from a complex ``(max_seq_len, D/2)`` cache: fp32 ``(1 or B, L, 1, D/2)``.

    ``positions`` ``(B, L)`` picks cache rows per token (``None``: rows
    ``0..seq_len-1`` for every batch row), read from the cache's real view.
    """
    angles = torch.view_as_real(rope_cache)  # (max_seq_len, D/2, [cos, sin])
    if positions is None:
        rows = angles[:seq_len].unsqueeze(0)
    else:
        rows = angles.index_select(0, positions.flatten()).unflatten(0, positions.shape)
    rows = rows.unsqueeze(2)
    return rows[..., 0], rows[..., 1]


def interleave_rotation_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r1, r2)`` for ``interleave`` mode: every angle repeated for both dims of its pair."""
    return torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([sin, sin], dim=-1).flatten(-2)


def fold_batch(x: torch.Tensor) -> torch.Tensor:
    """``(B, S, ...) -> (1, B*S, ...)``: the batch rows one after another in one sequence."""
    return x.flatten(0, 1).unsqueeze(0)


def rotary_npu(
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kernels: NpuKernels,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ComplexRoPE on ``(B, L, N, D)`` query/key via ``kernels.npu_rotary_mul`` in ``interleave`` mode (BSND).

    ``cos``/``sin`` are :func:`rotation_angles`; batch rows are folded into the
    sequence (:func:`fold_batch`), so the table is ``1S1D`` whatever the batch.
    """
    batch = query.shape[0]
    r1, r2 = (fold_batch(t.expand(batch, -1, -1, -1)) for t in interleave_rotation_tables(cos, sin))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return kernels.npu_rotary_mul(fold_batch(x.float()), r1, r2, rotary_mode="interleave").view(x.shape).type_as(x)

    return rotate(query), rotate(key)


class NpuComplexRoPE(ComplexRoPE):
    """``ComplexRoPE`` whose rotation runs on ``npu_rotary_mul`` for NPU tensors."""

    @dataclass(kw_only=True, slots=True)
    class Config(ComplexRoPE.Config):
        pass

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        kernels: NpuKernels | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``kernels`` defaults to torch_npu's for NPU tensors, else upstream ``ComplexRoPE`` runs."""
        kernels = select_kernels(kernels, query, key)
        if kernels is None:
            return super().forward(query, key, positions)
        cos, sin = rotation_angles(self.cache, positions, query.shape[1])
        return rotary_npu(query, key, cos, sin, kernels)


@override(
    target=ComplexRoPE.Config,
    exact=True,
    description="ComplexRoPE rotation via torch_npu.npu_rotary_mul (interleave mode, batch folded into S) on NPU.",
)
def npu_rotary_rope(cfg: ComplexRoPE.Config) -> NpuComplexRoPE.Config:
    return derive(cfg, NpuComplexRoPE.Config)
