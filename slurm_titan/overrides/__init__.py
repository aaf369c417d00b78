"""torchtitan overrides that run llama3's attention stack on Ascend NPU fused kernels.

Each target below is a ``module.function`` naming one torchtitan ``@override``
factory; activate them with ``--override.imports a,b,c``. The overridden
modules decide per call: tensors on an ``npu`` device use the ``torch_npu``
kernels, anything else runs a plain-torch reference path (which keeps
per-document causal masking, so CPU training with packed sequences is correct).

This package body only names the targets and must not import torch: the CLI
reads these strings without loading the training stack.
"""

NPU_FUSED_ATTENTION = "slurm_titan.overrides.npu_attention.npu_fused_attention"
"""FlexAttention -> ``npu_fusion_attention`` (TND varlen), reference on other devices."""

NPU_ROTARY_ROPE = "slurm_titan.overrides.npu_rope.npu_rotary_rope"
"""ComplexRoPE -> ``npu_rotary_mul``, upstream RoPE on other devices."""

NPU_RMS_NORM = "slurm_titan.overrides.npu_norm.npu_rms_norm"
"""RMSNorm -> ``npu_rms_norm``, upstream RMSNorm on other devices."""

NPU_SELECTIVE_AC = "slurm_titan.overrides.npu_selective_ac.npu_selective_ac"
"""Selective activation checkpointing that also saves ``npu_fusion_attention``'s outputs."""

OVERRIDE_TARGETS: tuple[str, ...] = (NPU_FUSED_ATTENTION, NPU_ROTARY_ROPE, NPU_RMS_NORM, NPU_SELECTIVE_AC)
"""Every kernel override target this package registers."""

RESHARDING_DATALOADER = "slurm_titan.overrides.resharding_loader.resharding_dataloader"
"""HuggingFaceTextDataLoader -> a loader whose checkpointed data position loads on any data-parallel degree
(activated by the plan when checkpoints are on, unless ``checkpoint.on_world_size_change: restart_data``)."""

TOKEN_SHARD_DATALOADER = "slurm_titan.overrides.token_shard_loader.token_shard_dataloader"
"""HuggingFaceTextDataLoader -> a loader of pre-tokenized token shards (Megatron ``.bin``/``.idx``) with the
resharding loader's position (activated by the plan when ``dataloader.dataset`` is ``token_shards``)."""

DEFAULT_NPU_OVERRIDES: tuple[str, ...] = OVERRIDE_TARGETS
"""Targets to activate when training on NPU."""

DEFAULT_CPU_OVERRIDES: tuple[str, ...] = (NPU_FUSED_ATTENTION,)
"""Targets to activate when training on CPU: FlexAttention has no CPU backward,
so the attention override's reference path is what makes CPU training work."""
