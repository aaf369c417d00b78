"""The torch_npu kernels the overrides call, and the per-call device dispatch.

The NPU code paths receive their kernels as an :class:`NpuKernels` value rather
than importing ``torch_npu`` themselves, so the same code runs against the real
kernels (:func:`torch_npu_kernels`, imported lazily, only on the NPU path) or
against the executable contract models in :mod:`.kernel_models` on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class NpuKernels:
    """The three ``torch_npu`` entry points, with torch_npu's own signatures."""

    npu_fusion_attention: Callable[..., tuple[Any, ...]]
    npu_rotary_mul: Callable[..., torch.Tensor]
    npu_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]


@cache
def torch_npu_kernels() -> NpuKernels:
    """Import ``torch_npu`` (only ever called on the NPU path) and bind its kernels."""
    import torch_npu

    return NpuKernels(
        npu_fusion_attention=torch_npu.npu_fusion_attention,
        npu_rotary_mul=torch_npu.npu_rotary_mul,
        npu_rms_norm=torch_npu.npu_rms_norm,
    )


def select_kernels(kernels: NpuKernels | None, *tensors: torch.Tensor | None) -> NpuKernels | None:
    """The kernels a call runs on; ``None`` selects the plain-torch reference path.

    Explicit ``kernels`` win (tests run the NPU path on CPU with the contract
    models). Otherwise torch_npu's kernels are used when every given tensor is
    a plain tensor on an ``npu`` device (``None`` entries are ignored).
    DTensors stay on the reference path: torch_npu 2.14.0 does register
    DTensor sharding for ``npu_fusion_attention`` and ``npu_rms_norm``
    (``torch_npu/distributed/tensor/_attention.py``, ``_math_ops.py``), but the
    NPU paths work out host-side arguments (the TND document ends of the
    batch, the RoPE tables) for plain local tensors and were never checked
    with sharded ones, while upstream's path is the one torchtitan's parallel
    plans are written for.
    """
    if kernels is not None:
        return kernels
    present = [t for t in tensors if t is not None]
    on_npu = bool(present) and all(not isinstance(t, DTensor) and t.device.type == "npu" for t in present)
    return torch_npu_kernels() if on_npu else None
