"""Override: selective activation checkpointing that also saves ``npu_fusion_attention``.

    --override.imports slurm_titan.overrides.npu_selective_ac.npu_selective_ac

torchtitan 0.3.0's ``SelectiveAC`` saves the outputs of the ops that
``_get_default_save_ops`` lists (aten SDPA variants, flex_attention,
``torch_attn._varlen_attn``, matmuls, ...) and recomputes every other op in
backward; torch_npu's fused attention is not listed, so each layer's attention
forward would run twice. :class:`NpuSelectiveAC` adds it, the way SelectiveAC's
docstring invites (override ``get_save_ops``).

The op exists only once torch_npu is imported (its op-plugin registers
``npu::npu_fusion_attention``), so it is looked up by name when the policy is
built; without it the save list is upstream's.

Its backward is a separate op, ``npu_fusion_attention_grad`` (op-plugin
``op_plugin/config/derivatives.yaml``), and needs no entry: the autograd engine
runs it once in backward, outside the checkpointed forward and its
recomputation, the only dispatches the policy is asked about. What it reads
(softmax_max, softmax_sum, attention_out, seed, offset) are the forward op's
outputs, which saving the forward keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.distributed.activation_checkpoint import SelectiveAC

NPU_FUSION_ATTENTION = "npu_fusion_attention"
"""The op's name in the ``torch.ops.npu`` namespace."""


def npu_save_ops() -> set[torch._ops.OpOverload]:
    """``torch.ops.npu.npu_fusion_attention.default`` where torch_npu registered it, else nothing."""
    try:
        packet = getattr(torch.ops.npu, NPU_FUSION_ATTENTION)
    except AttributeError:
        return set()
    return {packet.default}


class NpuSelectiveAC(SelectiveAC):
    """torchtitan's SelectiveAC, whose save list also holds the NPU fused attention."""

    @dataclass(kw_only=True, slots=True)
    class Config(SelectiveAC.Config):
        pass

    def get_save_ops(self) -> set:
        return super().get_save_ops() | npu_save_ops()


@override(
    target=SelectiveAC.Config,
    exact=True,
    description="Selective AC that saves npu_fusion_attention's outputs instead of recomputing them.",
)
def npu_selective_ac(cfg: SelectiveAC.Config) -> NpuSelectiveAC.Config:
    return derive(cfg, NpuSelectiveAC.Config)
