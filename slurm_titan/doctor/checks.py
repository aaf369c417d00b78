"""The checks: pure functions from facts (and the config's expectations) to failures.

`node_failures` judges one node on its own; `compare_nodes` judges the nodes of a job against each other
(the value most nodes have is the expected one). Chips are matched to logical device ids in `npu-smi info`
listing order; only the job's visible devices are judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from slurm_titan.doctor.expectations import GB, DoctorExpectations
from slurm_titan.doctor.facts import NodeFacts
from slurm_titan.doctor.report import Failure

HEALTHY = ("OK", "Warning")
BUSY_HBM_FRACTION = 0.5
NOT_INSTALLED = "not installed"
_COLLECTED = {
    "npu-smi": "`npu-smi info` listing the chips",
    "firmware": "`npu-smi info -t board` with a Firmware Version",
    "CANN": "CANN's ascend_toolkit_install.info (source set_env.sh)",
    "device count": "torch_npu imports and counts devices",
    "disk": "the checkpoint folder's filesystem",
    "network interface": "the list of network interfaces",
    "HCCL ports": "net.ipv4.ip_local_port_range",
}


def _gb(count: int) -> str:
    return f"{count / GB:.1f} GB"


def _npu_failures(facts: NodeFacts, expect: DoctorExpectations) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    if facts.npu_smi is not None:
        chips = facts.npu_smi.chips
        wanted = ",".join(map(str, expect.visible_devices))
        if expect.visible_devices and max(expect.visible_devices) >= len(chips):
            rows.append(("chips", f"{len(chips)} chips", f"logical devices {wanted} (ASCEND_RT_VISIBLE_DEVICES)"))
        for chip in (chips[i] for i in expect.visible_devices or range(len(chips)) if i < len(chips)):
            where = f"NPU {chip.npu_id} chip {chip.chip_id} ({chip.name})"
            if chip.health not in HEALTHY:
                rows.append(("chip health", f"{where}: {chip.health}", " or ".join(HEALTHY)))
            if chip.hbm_used_mb is not None and chip.hbm_total_mb and \
                    chip.hbm_used_mb > BUSY_HBM_FRACTION * chip.hbm_total_mb:
                rows.append(("chip busy", f"{where}: {chip.hbm_used_mb}/{chip.hbm_total_mb} MB HBM in use",
                             f"an idle chip (under {BUSY_HBM_FRACTION:.0%} HBM used)"))
    if len(set(facts.firmware.values())) > 1:
        rows.append(("firmware", ", ".join(sorted(set(facts.firmware.values()))), "one firmware on all NPUs"))
    if None not in (facts.device_count, expect.devices_per_node) and facts.device_count != expect.devices_per_node:
        rows.append(("device count", f"{facts.device_count} (torch.npu.device_count())",
                     f"{expect.devices_per_node} (slurm.devices_per_node)"))
    if facts.versions.get("torch_npu") is None:
        rows.append(("torch_npu", NOT_INSTALLED, "torch_npu matching torch"))
    return rows


def node_failures(facts: NodeFacts, expect: DoctorExpectations) -> list[Failure]:
    """What is wrong with this node on its own."""
    rows = [(check, found, _COLLECTED[check]) for check, found in facts.problems.items()]
    if expect.device == "npu":
        rows += _npu_failures(facts, expect)
    free, needed = facts.disk_free_bytes, expect.checkpoint_bytes
    if free is not None and needed and free < needed:
        rows.append(("disk", f"{_gb(free)} free at {facts.disk_path}",
                     f">= {_gb(needed)} for a checkpoint ({expect.checkpoint_size_source})"))
    if facts.interfaces is not None and (missing := [n for n in expect.socket_ifnames if n not in facts.interfaces]):
        rows.append(("network interface", f"no {', '.join(missing)} (has {', '.join(facts.interfaces)})",
                     f"{', '.join(expect.socket_ifnames)} (environment.npu.socket_ifname)"))
    if facts.ephemeral_range is not None:
        low, high = facts.ephemeral_range
        for first, last in expect.hccl_port_ranges:
            if first <= high and low <= last:
                rows.append(("HCCL ports", f"{first}-{last} overlaps this node's ephemeral ports {low}-{high}",
                             "ports outside net.ipv4.ip_local_port_range (environment.npu.port_base)"))
    return [Failure(facts.label, check, found, expected) for check, found, expected in rows]


def _versions(name: str) -> Callable[[NodeFacts], str | None]:
    return lambda facts: facts.versions.get(name) or NOT_INSTALLED


def _chip_types(facts: NodeFacts) -> str | None:
    return None if facts.npu_smi is None else ", ".join(sorted({chip.name for chip in facts.npu_smi.chips}))


ASPECTS: dict[str, Callable[[NodeFacts], str | None]] = {
    "chip type": _chip_types,
    "driver": lambda facts: facts.npu_smi.driver_version if facts.npu_smi else None,
    "firmware": lambda facts: ", ".join(sorted(set(facts.firmware.values()))) or None,
    "CANN": lambda facts: facts.cann_version,
    **{name: _versions(name) for name in ("python", "torch", "torch_npu", "torchtitan", "slurm-titan")},
}
"""What every node of a job must have alike. None: not collected (already a failure of that node)."""


def compare_nodes(nodes: list[NodeFacts]) -> list[Failure]:
    """The nodes that differ from the others, aspect by aspect (ties: the lowest node rank's value wins)."""
    failures: list[Failure] = []
    for check, value_of in ASPECTS.items():
        values = [(facts, value_of(facts)) for facts in sorted(nodes, key=lambda f: f.node_rank)]
        counts = Counter(value for _, value in values if value is not None)
        if len(counts) < 2:
            continue
        expected, count = counts.most_common(1)[0]
        failures += [Failure(facts.label, check, value, f"{expected} (as on {count} of {len(nodes)} nodes)")
                     for facts, value in values if value is not None and value != expected]
    return failures
