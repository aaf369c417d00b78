"""The checks: pure functions from facts (and the config's expectations) to findings (failures and warnings).

`node_findings` judges one node on its own; `compare_nodes` judges the nodes of a job against each other
(the value most nodes have is the expected one; device IPs must all differ); `reachability` judges one node's
ping of a peer node's NPU. Chips are matched to logical device ids in `npu-smi info` listing order; only the
job's visible devices are judged. The NPUs' network ports carry HCCL between nodes only, so their problems fail
a job of several nodes and are warnings otherwise. Port blocks are judged against this host's ephemeral range
only when the host binds them (`DoctorExpectations.hccl_port_ranges`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from slurm_titan.doctor import versions
from slurm_titan.doctor.expectations import GB, DoctorExpectations
from slurm_titan.doctor.facts import NodeFacts
from slurm_titan.doctor.hccn_tool import NET_HEALTH_OK
from slurm_titan.doctor.npu_smi import BUSY_HBM_FRACTION, Chip, NpuSmiInfo
from slurm_titan.doctor.ports import format_ranges, uncovered
from slurm_titan.doctor.report import FAIL, WARN, Finding

HEALTHY = ("OK", "Warning")
TRANSIENT_CHECKS = frozenset({"chip busy"})
"""Checks whose failure can clear by itself: a chip whose memory a killed rank of the attempt before still held
when the doctor's wait for its release ended (`finish` retries such a preflight once per node)."""
NOT_INSTALLED = "not installed"
NO_DEVICES_HINT = ("request the NPUs with --gres=npu:N (slurm.gres): a site that constrains devices with "
                   "cgroups (ConstrainDevices) gives a job without it no /dev/davinci*")
FUSION_ATTENTION_DOC = "op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md"
_COLLECTED = {
    "npu-smi": "`npu-smi info` listing the chips",
    "firmware": "`npu-smi info -t board` with a Firmware Version",
    "CANN": "CANN's ascend_toolkit_install.info (source set_env.sh)",
    "RAM tier": "checkpoint.memory.dir's free space",
    "host memory": "/proc/meminfo's MemAvailable",
    "CANN ops": "CANN's ops (kernels) package, the toolkit's version",
    "driver version": "the driver's version.info (mount it into containers)",
    "device count": "torch_npu imports and counts devices",
    "NPU kernels": "the override checks run on this node's NPU (`slurm-titan check-overrides --device npu`)",
    "disk": "the checkpoint folder's filesystem",
    "network interface": "the list of network interfaces",
    "HCCL ports": "net.ipv4.ip_local_port_range and net.ipv4.ip_local_reserved_ports",
}
_WARN_ONLY = {"driver version"}
"""Facts whose absence only weakens a check (the driver/CANN pairing): a warning, not a failure."""
Row = tuple[str, str, str, str]
"""(check, found, expected, severity)"""


def _gb(count: int) -> str:
    return f"{count / GB:.1f} GB"


def _where(chip: Chip) -> str:
    return f"NPU {chip.npu_id} chip {chip.chip_id} ({chip.name})"


def _temperature(chip: Chip, expect: DoctorExpectations) -> Row | None:
    if chip.temp_c is None or chip.temp_c < expect.temp_warn_c:
        return None
    hot = chip.temp_c >= expect.temp_fail_c
    return ("temperature", f"{_where(chip)}: {chip.temp_c} C",
            f"below {expect.temp_warn_c} C (at {expect.temp_fail_c} C the NPU throttles)", FAIL if hot else WARN)


def _holders(smi: NpuSmiInfo, chip: Chip) -> str:
    held = [f"pid {p.pid} ({p.name}, {p.memory_mb} MB)" for p in smi.holders(chip)]
    if not held:
        return "npu-smi shows no holder (another container's process, or memory not yet freed)"
    return f"held by {', '.join(held)}"


def _chip_rows(facts: NodeFacts, expect: DoctorExpectations) -> list[Row]:
    rows: list[Row] = []
    if facts.npu_smi is None:
        return rows
    chips = facts.npu_smi.chips
    wanted = ",".join(map(str, expect.visible_devices))
    if expect.visible_devices and max(expect.visible_devices) >= len(chips):
        rows.append(("chips", f"{len(chips)} chips", f"logical devices {wanted} (ASCEND_RT_VISIBLE_DEVICES)", FAIL))
    judged = facts.npu_smi.judged(expect.visible_devices)
    for chip in judged:
        if chip.health not in HEALTHY:
            rows.append(("chip health", f"{_where(chip)}: {chip.health}", " or ".join(HEALTHY), FAIL))
        if chip.busy:
            rows.append(("chip busy", f"{_where(chip)}: {chip.hbm_used_mb}/{chip.hbm_total_mb} MB HBM in use; "
                                      f"{_holders(facts.npu_smi, chip)}",
                         f"an idle chip (under {BUSY_HBM_FRACTION:.0%} HBM used) within {expect.busy_wait_s:.0f} s",
                         FAIL))
        if (row := _temperature(chip, expect)) is not None:
            rows.append(row)
    if any(chip.phy_id is not None for chip in judged):
        rows.append(("npu_fusion_attention", "Atlas A3 (910_93) chips: the NPU attention is not documented there",
                     f"Atlas A2 training or Ascend 950 ({FUSION_ATTENTION_DOC}); verify with "
                     "`slurm-titan check-overrides --device npu`", WARN))
    return rows


def _software_rows(facts: NodeFacts, expect: DoctorExpectations) -> list[Row]:
    rows: list[Row] = []
    if facts.davinci == []:
        rows.append(("NPU devices", "no /dev/davinci<N> device files", NO_DEVICES_HINT, FAIL))
    if facts.device_count == 0:
        rows.append(("device count", "0 (torch.npu.device_count())",
                     f"{expect.devices_per_node or 'at least 1'} NPU(s): {NO_DEVICES_HINT}", FAIL))
    elif None not in (facts.device_count, expect.devices_per_node) and facts.device_count != expect.devices_per_node:
        rows.append(("device count", f"{facts.device_count} (torch.npu.device_count())",
                     f"{expect.devices_per_node} (slurm.devices_per_node)", FAIL))
    torch_npu = facts.versions.get("torch_npu")
    if torch_npu is None:
        rows.append(("torch_npu", NOT_INSTALLED, "torch_npu matching torch", FAIL))
    rows += versions.torch_npu_rows(facts.versions.get("torch"), torch_npu, facts.cann_version)
    rows += versions.driver_rows(facts.driver, facts.cann_version, facts.cann_compatible)
    rows += [("NPU kernels", failed, "every check of `slurm-titan check-overrides --device npu` ok "
              "(doctor.check_kernels)", FAIL) for failed in facts.kernel_failures or ()]
    if None not in (facts.cann_ops_version, facts.cann_version) and facts.cann_ops_version != facts.cann_version:
        rows.append(("CANN ops", f"ops (kernels) package {facts.cann_ops_version} with toolkit {facts.cann_version}",
                     f"the ops package of CANN {facts.cann_version}", FAIL))
    return rows


def _network_rows(facts: NodeFacts, severity: str) -> list[Row]:
    rows: list[Row] = []
    for device, port in (facts.network or {}).items():
        where = f"NPU network port {device}"
        if port.ip is None:
            rows.append(("device IP", f"{where}: no IP", f"an IP (hccn_tool -i {device} -ip -g)", severity))
        if port.link != "UP":
            rows.append(("device link", f"{where}: link {port.link or 'unknown'}",
                         f"UP (hccn_tool -i {device} -link -g)", severity))
        if port.net_health not in NET_HEALTH_OK:
            rows.append(("device network", f"{where}: {port.net_health or 'unknown'}",
                         f"{' or '.join(NET_HEALTH_OK)} (hccn_tool -i {device} -net_health -g)", severity))
    switches = sorted({str(port.tls_switch) for port in (facts.network or {}).values()})
    if len(switches) > 1:
        rows.append(("device TLS", f"TLS switches {', '.join(switches)} on one node",
                     "one TLS switch on every NPU (hccn_tool -i N -tls -g)", severity))
    return rows


def _port_rows(facts: NodeFacts, expect: DoctorExpectations) -> list[Row]:
    if facts.ephemeral_range is None:
        return []
    low, high = facts.ephemeral_range
    rows: list[Row] = []
    for first, last in expect.hccl_port_ranges:
        inside = (max(first, low), min(last, high))
        if inside[0] > inside[1]:
            continue
        gaps = uncovered(*inside, facts.reserved_ports or ())
        if gaps:
            rows.append(("HCCL ports", f"{first}-{last} overlaps this node's ephemeral ports {low}-{high} "
                                       f"({format_ranges(gaps)} not reserved)",
                         "ports outside net.ipv4.ip_local_port_range (environment.npu.port_base / "
                         "environment.npu.if_base_port) or reserved: "
                         f"sysctl -w net.ipv4.ip_local_reserved_ports={format_ranges(gaps)}", FAIL))
    return rows


def node_findings(facts: NodeFacts, expect: DoctorExpectations, num_nodes: int = 1) -> list[Finding]:
    """What is wrong with this node on its own, in a job of `num_nodes` nodes."""
    rows = [(check, found, _COLLECTED[check], WARN if check in _WARN_ONLY else FAIL)
            for check, found in facts.problems.items()]
    if expect.device == "npu":
        rows += _chip_rows(facts, expect)
        if len(set(facts.firmware.values())) > 1:
            rows.append(("firmware", ", ".join(sorted(set(facts.firmware.values()))), "one firmware on all NPUs", FAIL))
        rows += _software_rows(facts, expect)
        rows += _network_rows(facts, FAIL if num_nodes > 1 else WARN)
    free, needed = facts.disk_free_bytes, expect.checkpoint_bytes
    if free is not None and needed and free < needed:
        rows.append(("disk", f"{_gb(free)} free at {facts.disk_path}",
                     f">= {_gb(needed)} for a checkpoint ({expect.checkpoint_size_source})", FAIL))
    rows += _memory_rows(facts, expect) + _standby_rows(facts, expect)
    if facts.interfaces is not None and (missing := [n for n in expect.socket_ifnames if n not in facts.interfaces]):
        rows.append(("network interface", f"no {', '.join(missing)} (has {', '.join(facts.interfaces)})",
                     f"{', '.join(expect.socket_ifnames)} (environment.npu.socket_ifname)", FAIL))
    rows += _port_rows(facts, expect)
    return [Finding(facts.label, check, found, expected, severity) for check, found, expected, severity in rows]


MEMORY_CHECK = "RAM tier"
STANDBY_CHECK = "standby step"
HOST_COPIES = 5
"""Host memory the RAM tier needs, in shares of a checkpoint: the 4 in its folder and the ranks' staging copy."""


def _memory_rows(facts: NodeFacts, expect: DoctorExpectations) -> list[Row]:
    """The RAM tier's budget: its folder's free space and the node's available memory against what it needs."""
    needed = expect.memory_bytes
    if not needed:
        return []
    severity = FAIL if expect.memory_required else WARN
    rows = []
    if facts.memory_free_bytes is not None and facts.memory_free_bytes < needed:
        rows.append((MEMORY_CHECK, f"{_gb(facts.memory_free_bytes)} free at {facts.memory_path}",
                     f">= {_gb(needed)} (4 snapshots of the node's share: {expect.checkpoint_size_source})", severity))
    host = needed // 4 * HOST_COPIES
    if facts.mem_available_bytes is not None and facts.mem_available_bytes < host:
        rows.append((MEMORY_CHECK, f"{_gb(facts.mem_available_bytes)} of memory available",
                     f">= {_gb(host)} (the snapshots and the ranks' staging copy)", severity))
    return rows


def _standby_rows(facts: NodeFacts, expect: DoctorExpectations) -> list[Row]:
    """The standby step's processes (`preemption.standby_step`), with the RAM tier's host memory if it is on,
    against the node's available memory: a warning (the standby is optional; the setting is the user's to turn off)."""
    if not expect.standby_bytes or facts.mem_available_bytes is None:
        return []
    tier = expect.memory_bytes // 4 * HOST_COPIES if expect.memory_bytes else 0
    needed = expect.standby_bytes + tier
    if facts.mem_available_bytes >= needed:
        return []
    with_tier = f" and the RAM tier's {_gb(tier)}" if tier else ""
    return [(STANDBY_CHECK, f"{_gb(facts.mem_available_bytes)} of memory available",
             f">= {_gb(needed)} (a standby process per rank, {_gb(expect.standby_bytes)}{with_tier}: "
             f"preemption.standby_step)", WARN)]


def _versions(name: str) -> Callable[[NodeFacts], str | None]:
    return lambda facts: facts.versions.get(name) or NOT_INSTALLED


def _chip_types(facts: NodeFacts) -> str | None:
    return None if facts.npu_smi is None else ", ".join(sorted({chip.name for chip in facts.npu_smi.chips}))


def _tls(facts: NodeFacts) -> str | None:
    switches = {port.tls_switch for port in (facts.network or {}).values() if port.tls_switch is not None}
    return ", ".join(map(str, sorted(switches))) or None


ASPECTS: dict[str, Callable[[NodeFacts], str | None]] = {
    "chip type": _chip_types,
    "driver": lambda facts: facts.npu_smi.driver_version if facts.npu_smi else None,
    "firmware": lambda facts: ", ".join(sorted(set(facts.firmware.values()))) or None,
    "CANN": lambda facts: facts.cann_version,
    "device TLS": _tls,
    **{name: _versions(name) for name in ("python", "torch", "torch_npu", "torchtitan", "slurm-titan")},
}
"""What every node of a job must have alike. None: not collected (already a finding of that node)."""


def _duplicate_ips(nodes: list[NodeFacts]) -> list[Finding]:
    holders: dict[str, list[tuple[NodeFacts, str]]] = defaultdict(list)
    for facts in nodes:
        for device, port in (facts.network or {}).items():
            if port.ip is not None:
                holders[port.ip].append((facts, device))
    findings: list[Finding] = []
    for ip, ports in holders.items():
        (owner, owner_device), *others = ports
        findings += [Finding(facts.label, "device IP", f"NPU network port {device}: {ip}, as port {owner_device} "
                             f"of node {owner.label}", "a device IP of its own (hccn_tool -i N -ip -g)")
                     for facts, device in others]
    return findings


def compare_nodes(nodes: list[NodeFacts]) -> list[Finding]:
    """The nodes that differ from the others, aspect by aspect (ties: the lowest node rank's value wins), and
    device IPs held twice."""
    nodes = sorted(nodes, key=lambda f: f.node_rank)
    findings: list[Finding] = []
    for check, value_of in ASPECTS.items():
        values = [(facts, value_of(facts)) for facts in nodes]
        counts = Counter(value for _, value in values if value is not None)
        if len(counts) < 2:
            continue
        expected, count = counts.most_common(1)[0]
        findings += [Finding(facts.label, check, value, f"{expected} (as on {count} of {len(nodes)} nodes)")
                     for facts, value in values if value is not None and value != expected]
    return findings + _duplicate_ips(nodes)


def ping_pair(facts: NodeFacts, peer: NodeFacts) -> tuple[str, str] | None:
    """(this node's device, the peer's device IP) to ping: the first judged NPU of each with an IP; None when
    either node has no device network facts."""
    mine = next((device for device, port in (facts.network or {}).items() if port.ip is not None), None)
    theirs = next((port.ip for port in (peer.network or {}).values() if port.ip is not None), None)
    return None if mine is None or theirs is None else (mine, theirs)


def reachability(facts: NodeFacts, peer: NodeFacts, device: str, address: str,
                 outcome: tuple[int, int] | str) -> list[Finding]:
    """The finding of `hccn_tool -i device -ping -g address <address>` (peer's NPU): (sent, received) or why
    it could not run. Any lost packet fails: HCCL needs every NPU pair across nodes reachable."""
    command = f"hccn_tool -i {device} -ping -g address {address}"
    if isinstance(outcome, str):
        found = f"{command}: {outcome}"
    elif outcome[1] < outcome[0] or outcome[0] == 0:
        found = f"{command}: {outcome[1]} of {outcome[0]} packets received"
    else:
        return []
    return [Finding(facts.label, "device reachability", found,
                    f"node {peer.label}'s NPU answers (device IPs in one routable network, same TLS switch)")]
