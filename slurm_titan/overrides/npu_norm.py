"""Override: torchtitan ``RMSNorm`` computed with ``torch_npu.npu_rms_norm``.

    --override.imports slurm_titan.overrides.npu_norm.npu_rms_norm

``npu_rms_norm(x, gamma, epsilon)`` returns ``(x / sqrt(mean(x**2) + eps) * gamma,
rstd)`` over ``gamma``'s trailing dims, and requires ``gamma`` in ``x``'s dtype
(Ascend/op-plugin ``docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_rms_norm.md``).
Tensors off NPU (and DTensors) run upstream ``RMSNorm`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.nn_modules import RMSNorm

from slurm_titan.overrides.kernels import NpuKernels, select_kernels


def rms_norm_npu(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    kernels: NpuKernels,
) -> torch.Tensor:
    """RMSNorm over the last dim via ``kernels.npu_rms_norm``; a missing weight means ones."""
    gamma = x.new_ones(x.shape[-1]) if weight is None else weight.to(x.dtype)
    return kernels.npu_rms_norm(x, gamma, epsilon=eps)[0]


class NpuRMSNorm(RMSNorm):
    """``RMSNorm`` that runs ``npu_rms_norm`` for NPU tensors."""

    @dataclass(kw_only=True, slots=True)
    class Config(RMSNorm.Config):
        pass

    def forward(self, x: torch.Tensor, *, kernels: NpuKernels | None = None) -> torch.Tensor:
        """``kernels`` defaults to torch_npu's for NPU tensors, else upstream ``RMSNorm`` runs."""
        kernels = select_kernels(kernels, x, self.weight)
        if kernels is None:
            return super().forward(x)
        # nn.RMSNorm semantics: eps=None means the dtype's machine epsilon.
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return rms_norm_npu(x, self.weight, eps, kernels)


@override(
    target=RMSNorm.Config,
    exact=True,
    description="RMSNorm via torch_npu.npu_rms_norm on NPU.",
)
def npu_rms_norm(cfg: RMSNorm.Config) -> NpuRMSNorm.Config:
    return derive(cfg, NpuRMSNorm.Config)
