"""What Ascend's kernels cannot take: documented limits, and a dispatch mode that refuses the rest on CPU.

Evidence (audit ``npu-audit.md`` sections 1, 2 and 13; nothing here ran on an NPU):

* Complex tensors. ``aclnnIndex`` has no complex64 ("Tensor self not
  implemented for DT_COMPLEX64", vllm-project/vllm PR #49669 on 910B;
  vllm-project/vllm-omni #4911 on 910B3 with torch_npu 2.10.0) and
  ``aclnnGather`` no complex128 (vllm-omni #6571); op-plugin's
  ``IndexKernelNpuOpApi.cpp`` calls aclnnIndex with no complex fallback, and
  hicann/torchtitan-npu indexes a real view of the cache for this reason. Those
  ops are refused as documented gaps. Every other op on a complex tensor,
  except views (``view_as_real``, ``unsqueeze``, ...: metadata, no kernel), is
  refused too: the NPU code paths are meant to be real-valued, and a complex
  kernel they reached would be one that nobody has run on Ascend.
* ``npu_fusion_attention`` (torch_npu 2.14.0 ``_op_plugin_docs.py``):
  "actual_seq_qlen的长度取值范围为1~2K, varlen场景下长度最大支持1K" (at most 1024
  sequences per TND call), "varlen场景下: 要求T(B*S)取值范围1~1M" (T <= 2**20
  tokens), head dim D <= 768 and query heads N <= 256.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

VARLEN_MAX_SEQUENCES = 1024
"""Most sequences (``len(actual_seq_qlen)``) one TND ``npu_fusion_attention`` call takes."""

VARLEN_MAX_TOKENS = 2**20
"""Most tokens T one TND ``npu_fusion_attention`` call takes."""

FUSION_ATTENTION_MAX_HEAD_DIM = 768
"""Largest head dim D of ``npu_fusion_attention``."""

FUSION_ATTENTION_MAX_HEADS = 256
"""Most query heads N of ``npu_fusion_attention``."""

_aten = torch.ops.aten

COMPLEX_UNSUPPORTED = frozenset({_aten.index.Tensor, _aten.gather.default, _aten.index_select.default})
"""Ops whose Ascend kernels are reported to have no complex dtypes (aclnnIndex, aclnnGather)."""


class AscendUnsupportedError(RuntimeError):
    """An op that the NPU code path must not run on Ascend."""


class HostSyncError(RuntimeError):
    """An op that would make the host wait for the device."""


class _RefusingMode(TorchDispatchMode):
    """Runs every op but those :meth:`refusal` gives a reason for, which raise ``error`` with that reason."""

    error: type[RuntimeError] = RuntimeError

    def refusal(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if (why := self.refusal(func, args, kwargs)) is not None:
            raise self.error(why)
        return func(*args, **kwargs)


class RefuseAscendUnsupported(_RefusingMode):
    """Raise :class:`AscendUnsupportedError` on any op but a view that takes a complex tensor.

    Wrap a CPU run of an NPU code path (with the contract models of
    :mod:`.kernel_models`) in it to see what the device would refuse.
    """

    error = AscendUnsupportedError

    def refusal(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        complex_inputs = [
            t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_complex()
        ]
        if not complex_inputs or func.is_view:
            return None
        why = "has no complex kernel on Ascend" if func in COMPLEX_UNSUPPORTED else "is not verified on Ascend"
        return f"{func} on a {complex_inputs[0].dtype} tensor {why} (NPU code path)"


HOST_SYNCS = frozenset({_aten._local_scalar_dense.default, _aten.nonzero.default})
"""Ops that wait for a device tensor's values on the host (``.item()``, ``int()``, ``bool()``; ``nonzero``'s size)."""


class RefuseHostSync(_RefusingMode):
    """Raise :class:`HostSyncError` on :data:`HOST_SYNCS`: wrap a CPU run of a path meant to leave the device's
    queue alone (e.g. a forward) in it."""

    error = HostSyncError

    def refusal(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return f"{func} waits for the device on the host" if func in HOST_SYNCS else None
