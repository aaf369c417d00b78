"""Make torchtitan 0.3.0 run on the CPU with gloo, the stand-in for NPU + HCCL.

torchtitan picks its device once, at import, from
``torch._utils._get_available_device_type() or "cuda"`` and then calls CUDA-style functions on
that device's module. `install()` must run before torchtitan is imported: it makes the probe
answer "cpu", gives ``torch.cpu`` the few device-module calls torchtitan makes, and keeps FSDP's
gradient reduction to plain SUM/AVG (gloo has no PREMUL_SUM).
"""

from __future__ import annotations

import os
import resource
import types
from typing import Any

import torch


def _memory_stats(device: Any = None) -> dict[str, int]:
    """The process's peak resident memory stands in for the device allocator's peaks."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}


def _device_properties(device: Any = None) -> types.SimpleNamespace:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(name="cpu", total_memory=total, major=0, minor=0)


# torch.cpu already has set_device/device_count/synchronize; current_device is replaced because it
# answers "cpu" where torchtitan passes the answer on as a device index (barrier(device_ids=[...])).
_CPU_DEVICE_CALLS: dict[str, Any] = {
    "current_device": lambda: 0,
    "empty_cache": lambda: None,
    "memory_stats": _memory_stats,
    "reset_peak_memory_stats": lambda device=None: None,
    "get_device_name": lambda device=None: "cpu",
    "get_device_properties": _device_properties,
}


def _install_memory_namespace() -> None:
    memory = getattr(torch.cpu, "memory", None) or types.ModuleType("torch.cpu.memory")
    calls = {name: _CPU_DEVICE_CALLS[name] for name in ("empty_cache", "memory_stats", "reset_peak_memory_stats")}
    for name, fn in (calls | {"max_memory_reserved": lambda device=None: 0}).items():
        if not hasattr(memory, name):
            setattr(memory, name, fn)
    torch.cpu.memory = memory  # type: ignore[attr-defined]  # a namespace added here: torch.cpu has none of its own


def _keep_gloo_reductions() -> None:
    """Make FSDP2 reduce gradients with SUM and divide locally, as it does for MTIA.

    Its default reduce-scatter uses AVG or PREMUL_SUM, which gloo does not implement.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    original = _fsdp_collectives._get_gradient_divide_factors
    if getattr(original, "slurm_titan_sum_only", False):
        return

    def sum_only_divide_factors(*args: Any, **kwargs: Any) -> Any:
        kwargs["force_sum_reduction_for_comms"] = True
        return original(*args[:5], **kwargs)

    sum_only_divide_factors.slurm_titan_sum_only = True  # type: ignore[attr-defined]
    _fsdp_collectives._get_gradient_divide_factors = sum_only_divide_factors


def install() -> None:
    """Route torchtitan's device probe and device-module calls to the CPU. Idempotent."""
    torch._utils._get_available_device_type = lambda: "cpu"
    for name, fn in _CPU_DEVICE_CALLS.items():
        setattr(torch.cpu, name, fn)
    _install_memory_namespace()
    _keep_gloo_reductions()
