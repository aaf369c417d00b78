"""What the preflight doctor expects of every node of a job, derived from its config at plan time."""

from __future__ import annotations

import math
from dataclasses import replace

from slurm_titan.doctor.expectations import GB, DoctorExpectations
from slurm_titan.launch import npu_env
from slurm_titan.launch.config import JobConfig

PARAMETERS = {"llama3_debugmodel": 6_163_712, "llama3_8b": 8_030_261_248, "llama3_70b": 70_553_706_496}
"""Parameter counts of torchtitan 0.3.0's llama3 configs (counted on a meta-device model)."""
BYTES_PER_PARAMETER = 12
"""A full checkpoint: fp32 weights plus AdamW's two fp32 moments."""
STANDBY_RANK_BYTES = 650 * 10**6
"""A standby step's rank: a process with torch and torchtitan imported, waiting (its resident memory on the bundled
cluster, a CPU rank; torch_npu's import adds to it on an NPU node, not measured here)."""


def preflight_expectations(config: JobConfig, checkpoint_dir: str | None) -> DoctorExpectations:
    """`checkpoint_dir`: the folder torchtitan saves to (None: checkpointing is off). The port blocks judged
    against each node's ephemeral range are the host's (DoctorExpectations.hccl_port_ranges)."""
    slurm = config.slurm
    size, source = _checkpoint_size(config)
    memory = config.checkpoint.memory
    expect = DoctorExpectations(device=config.environment.device, devices_per_node=slurm.devices_per_node,
                                checkpoint_dir=checkpoint_dir, checkpoint_bytes=size, checkpoint_size_source=source,
                                memory_dir=memory.dir if memory.enable else None,
                                memory_bytes=4 * size if memory.enable and size else None,
                                memory_required=memory.required,
                                standby_bytes=(slurm.devices_per_node * STANDBY_RANK_BYTES
                                               if config.preemption.standby_step else None))
    if expect.device != "npu":
        return expect
    spec = config.environment.npu
    host, _, root = npu_env.hccl_port_ranges(spec, slurm.devices_per_node,
                                             (slurm.port_window[0], slurm.port_window[1]))
    return replace(expect, visible_devices=tuple(npu_env.visible_devices(spec, slurm.devices_per_node)),
                   socket_ifnames=tuple(spec.socket_ifname), ascend_home=spec.ascend_home,
                   hccl_port_ranges=tuple((r.low, r.high) for r in (host, root)),
                   check_kernels=config.doctor.check_kernels,
                   temp_warn_c=spec.temp_warn_c, temp_fail_c=spec.temp_fail_c)


def _checkpoint_size(config: JobConfig) -> tuple[int | None, str]:
    """Each node's share of one checkpoint (its ranks' shards), from the config or the parameter count, and where
    the number comes from; (None, "") when unknown."""
    nodes = config.slurm.nodes
    if not config.checkpoint.enable:
        return None, ""
    if config.checkpoint.expected_size_gb is not None:
        total, source = config.checkpoint.expected_size_gb * GB, "checkpoint.expected_size_gb"
    elif (count := PARAMETERS.get(config.torchtitan.config)) is not None:
        total = count * BYTES_PER_PARAMETER
        source = f"estimated: {count / 1e9:.2f}B parameters x {BYTES_PER_PARAMETER} B"
    else:
        return None, ""
    return math.ceil(total / nodes), f"{source} / {nodes} node(s)"
