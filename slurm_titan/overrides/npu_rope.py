"""Override: llama3's ``ComplexRoPE`` applied with ``torch_npu.npu_rotary_mul``.

    --override.imports slurm_titan.overrides.npu_rope.npu_rotary_rope

``ComplexRoPE`` rotates adjacent pairs ``(x[2i], x[2i+1])`` by the angle of
cache entry ``i``. ``npu_rotary_mul(x, r1, r2)`` in its default ``half`` mode
computes ``r1 * x + r2 * cat(-x2, x1)`` with ``x1, x2`` the two halves of the
last dim (Ascend/op-plugin ``docs/context/torch_npu-npu_rotary_mul.md``). So
the NPU path de-interleaves the head dim (even dims, then odd dims), rotates
with ``r1 = cat(cos, cos)``, ``r2 = cat(sin, sin)`` and re-interleaves. The
``interleave`` mode would avoid the shuffles but only accepts ``1S1D`` tables,
while torchtitan's per-document positions give a ``BS1D`` table, which the
``half`` mode accepts. Like upstream, the rotation runs in fp32.

Tensors off NPU (and DTensors) run upstream ``ComplexRoPE`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.rope import ComplexRoPE

from .kernels import NpuKernels, select_kernels


def half_rotation_tables(rope_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r1, r2)`` for ``npu_rotary_mul``'s half mode from a complex cache ``(..., D/2)``: fp32 ``(..., D)``."""
    cos, sin = rope_cache.real.float(), rope_cache.imag.float()
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]`` along the last dim."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


def reinterleave(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`deinterleave`."""
    return x.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)


def rotary_npu(
    query: torch.Tensor,
    key: torch.Tensor,
    rope_cache: torch.Tensor,
    kernels: NpuKernels,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ComplexRoPE on ``(B, L, N, D)`` query/key via ``kernels.npu_rotary_mul`` (BSND layout)."""
    r1, r2 = half_rotation_tables(rope_cache)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        rotated = kernels.npu_rotary_mul(deinterleave(x.float()), r1, r2)
        return reinterleave(rotated).type_as(x)

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
        return rotary_npu(query, key, self._reshape_cache(query, positions), kernels)


@override(
    target=ComplexRoPE.Config,
    exact=True,
    description="ComplexRoPE rotation via torch_npu.npu_rotary_mul (half mode) on NPU.",
)
def npu_rotary_rope(cfg: ComplexRoPE.Config) -> NpuComplexRoPE.Config:
    return derive(cfg, NpuComplexRoPE.Config)
