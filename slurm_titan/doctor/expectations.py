"""What the preflight expects of every node, derived from the job config (no torch; pickled into the job)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurm_titan.launch import npu_env

if TYPE_CHECKING:
    from slurm_titan.launch.config import JobConfig

PARAMETERS = {"llama3_debugmodel": 6_163_712, "llama3_8b": 8_030_261_248, "llama3_70b": 70_553_706_496}
"""Parameter counts of torchtitan 0.3.0's llama3 configs (counted on a meta-device model)."""
BYTES_PER_PARAMETER = 12
"""A full checkpoint: fp32 weights plus AdamW's two fp32 moments."""
GB = 10**9


@dataclass(frozen=True)
class DoctorExpectations:
    """The config's side of every check; an empty or None field skips its check.

    `visible_devices` empty means every chip. `checkpoint_dir` is where torchtitan saves (it may hold the plan's
    job placeholders until `for_job`); `checkpoint_bytes` is the free space each node needs there: its share
    of one checkpoint (`checkpoint.expected_size_gb`, or estimated from the model's parameter count).
    """

    device: str = "npu"
    devices_per_node: int | None = None
    visible_devices: tuple[int, ...] = ()
    socket_ifnames: tuple[str, ...] = ()
    hccl_port_ranges: tuple[tuple[int, int], ...] = ()
    ascend_home: str = "/usr/local/Ascend"
    checkpoint_dir: str | None = None
    checkpoint_bytes: int | None = None
    checkpoint_size_source: str = ""
    temp_warn_c: int = 75
    temp_fail_c: int = 85
    """Chip temperature limits: seed 000 ("正常应该在75°C以下,如果到85°C以上,NPU会降频": normal below
    75 C, above 85 C the NPU throttles). At `temp_warn_c` or more a warning, at `temp_fail_c` or more a failure."""

    @classmethod
    def from_config(cls, config: JobConfig, checkpoint_dir: str | None) -> DoctorExpectations:
        """`checkpoint_dir`: the folder torchtitan saves to (None: checkpointing is off)."""
        slurm = config.slurm
        expect = cls(device=config.environment.device, devices_per_node=slurm.devices_per_node,
                     checkpoint_dir=checkpoint_dir, **_checkpoint_size(config))
        if expect.device != "npu":
            return expect
        spec = config.environment.npu
        ranges = npu_env.hccl_port_ranges(spec, slurm.devices_per_node, (slurm.port_window[0], slurm.port_window[1]))
        return replace(expect, visible_devices=tuple(npu_env.visible_devices(spec, slurm.devices_per_node)),
                       socket_ifnames=tuple(spec.socket_ifname), ascend_home=spec.ascend_home,
                       hccl_port_ranges=tuple((r.low, r.high) for r in ranges),
                       temp_warn_c=spec.temp_warn_c, temp_fail_c=spec.temp_fail_c)

    def for_job(self, fill: Callable[[str], str]) -> DoctorExpectations:
        """These expectations with the job's placeholders filled in (`fill`, e.g. `lambda t: spec.fill(t, job_id)`)."""
        return self if self.checkpoint_dir is None else replace(self, checkpoint_dir=fill(self.checkpoint_dir))


def _checkpoint_size(config: JobConfig) -> dict[str, object]:
    """Each node's share of one checkpoint (its ranks' shards), from the config or the parameter count."""
    nodes = config.slurm.nodes
    if not config.checkpoint.enable:
        return {}
    if config.checkpoint.expected_size_gb is not None:
        total, source = config.checkpoint.expected_size_gb * GB, "checkpoint.expected_size_gb"
    elif (count := PARAMETERS.get(config.torchtitan.config)) is not None:
        total = count * BYTES_PER_PARAMETER
        source = f"estimated: {count / 1e9:.2f}B parameters x {BYTES_PER_PARAMETER} B"
    else:
        return {}
    return {"checkpoint_bytes": math.ceil(total / nodes), "checkpoint_size_source": f"{source} / {nodes} node(s)"}
