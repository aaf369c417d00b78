"""The node environment of an NPU job, generated from `environment.npu` and checked against CANN's documented ranges.

Sources (CANN 8.x environment variable reference, hiascend.com `envref_07_*` / `hcclenvref_07_*`):

- `set_env.sh`: `<ascend>/ascend-toolkit/set_env.sh` (CANN <= 8.3), `<ascend>/cann/set_env.sh` (8.5+), NNAL's
  ATB library `<ascend>/nnal/atb/set_env.sh`. A batch shell does not read ~/.bashrc, so the job sources them.
- ASCEND_RT_VISIBLE_DEVICES: logical device ids, comma-separated, ascending, nothing else in the value.
- HCCL_CONNECT_TIMEOUT: integer seconds in [120, 7200]. HCCL_EXEC_TIMEOUT: integer seconds in
  [0, 2147483647] on Atlas A2/A3 (0: never).
- HCCL_IF_IP (one address) outranks HCCL_SOCKET_IFNAME; `=a,b` selects exactly interface a or b.
  GLOO_SOCKET_IFNAME takes plain comma-separated names (torch.distributed).
- HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE: `low-high` within [1, 65535] (1-1023 reserved),
  no fewer ports than HCCL processes per NPU; without them the ranks of one node can collide on the default
  ports (EI0020, Communication_Error_Bind_IP_Port). Here: one node-wide block of `ports_per_device` ports per
  device each, outside `slurm.port_window` (the master port) and the kernel's ephemeral range (checked again
  on every node by the doctor against its own /proc/sys/net/ipv4/ip_local_port_range).
- PYTORCH_NPU_ALLOC_CONF (torch_npu): `option:value,...`; max_split_size_mb > 20, garbage_collection_threshold
  in (0, 1), expandable_segments True/False, base_addr_aligned_kb 0..16, page_size 1g, segment_size_mb > 0;
  a non-default max_split_size_mb or garbage_collection_threshold needs expandable_segments:False.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slurm_titan.errors import ConfigError
from slurm_titan.node.outcome import PREFLIGHT_EXIT_CODE
from slurm_titan.templating import render

if TYPE_CHECKING:
    from slurm_titan.config import JobConfig

LINUX_EPHEMERAL = (32768, 60999)
"""The kernel's default net.ipv4.ip_local_port_range, assumed at plan time."""
CONNECT_TIMEOUT_RANGE = (120, 7200)
EXEC_TIMEOUT_RANGE = (0, 2_147_483_647)
PORT_FLOOR = 1024
PORT_CEILING = 65535
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_MANAGED = ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
            "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_HOST_SOCKET_PORT_RANGE",
            "HCCL_NPU_SOCKET_PORT_RANGE", "PYTORCH_NPU_ALLOC_CONF")


@dataclass
class NpuSpec:
    """`environment.npu`: where CANN is and how HCCL / torch_npu are set up on every node.

    `set_env` pins CANN's set_env.sh (default: the first of `<ascend_home>/ascend-toolkit/set_env.sh` and
    `<ascend_home>/cann/set_env.sh` that exists on the node). `visible_devices` defaults to
    0..devices_per_node-1. `socket_ifname` names the NICs for HCCL's and gloo's bootstrap; `if_ip` is for one-node
    jobs only (one node's address). `port_base` pins the first HCCL port (default: computed).
    """

    ascend_home: str = "/usr/local/Ascend"
    set_env: str | None = None
    visible_devices: list[int] | None = None
    socket_ifname: list[str] = field(default_factory=list)
    if_ip: str | None = None
    connect_timeout_s: int = 1200
    exec_timeout_s: int = 1836
    port_base: int | None = None
    ports_per_device: int = 16
    alloc_conf: str | None = "expandable_segments:True"


@dataclass(frozen=True)
class PortRange:
    """An inclusive range of TCP ports."""

    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def overlaps(self, low: int, high: int) -> bool:
        return self.low <= high and low <= self.high


def set_env_candidates(spec: NpuSpec) -> list[str]:
    """CANN set_env.sh paths the job tries, in order."""
    if spec.set_env:
        return [spec.set_env]
    return [f"{spec.ascend_home}/ascend-toolkit/set_env.sh", f"{spec.ascend_home}/cann/set_env.sh"]


def visible_devices(spec: NpuSpec, devices_per_node: int) -> list[int]:
    return list(range(devices_per_node)) if spec.visible_devices is None else list(spec.visible_devices)


def hccl_port_ranges(spec: NpuSpec, devices_per_node: int, port_window: tuple[int, int],
                     ephemeral: tuple[int, int] = LINUX_EPHEMERAL) -> tuple[PortRange, PortRange]:
    """The (host, NPU) port ranges of every node: two adjacent blocks of ports_per_device ports per device.

    Placed at `port_base`, or else just above the ephemeral range, above the port window, or from 1024 (the
    first that fits). ValueError says why no placement fits.
    """
    size = devices_per_node * spec.ports_per_device
    forbidden = {"slurm.port_window": port_window, "the kernel's ephemeral range": ephemeral}

    def blocks(base: int) -> tuple[PortRange, PortRange]:
        return PortRange(base, base + size - 1), PortRange(base + size, base + 2 * size - 1)

    def problem(base: int) -> str | None:
        host, npu = blocks(base)
        if host.low < PORT_FLOOR or npu.high > PORT_CEILING:
            return f"ports {host.low}-{npu.high} leave {PORT_FLOOR}-{PORT_CEILING}"
        clashes = [f"{name} {low}-{high}" for name, (low, high) in forbidden.items()
                   if host.overlaps(low, high) or npu.overlaps(low, high)]
        return f"ports {host.low}-{npu.high} overlap {' and '.join(clashes)}" if clashes else None

    if spec.port_base is not None:
        if why := problem(spec.port_base):
            raise ValueError(why)
        return blocks(spec.port_base)
    for base in (ephemeral[1] + 1, port_window[1] + 1, PORT_FLOOR):
        if problem(base) is None:
            return blocks(base)
    raise ValueError(f"no room for {2 * size} HCCL ports ({devices_per_node} devices x {spec.ports_per_device} "
                     f"x host+NPU) outside slurm.port_window and the ephemeral range; lower ports_per_device")


def _is_float_in_open_unit(value: str) -> bool:
    try:
        return 0.0 < float(value) < 1.0
    except ValueError:
        return False


_ALLOC_OPTIONS: dict[str, tuple[Callable[[str], bool], str]] = {
    "max_split_size_mb": (lambda v: v.isdigit() and int(v) > 20, "an integer > 20"),
    "garbage_collection_threshold": (_is_float_in_open_unit, "a number in (0, 1)"),
    "expandable_segments": (lambda v: v in ("True", "False"), "True or False"),
    "base_addr_aligned_kb": (lambda v: v.isdigit() and int(v) <= 16, "an integer in 0..16"),
    "page_size": (lambda v: v.lower() == "1g", "1g"),
    "segment_size_mb": (lambda v: v.isdigit() and int(v) > 0, "a positive integer"),
}


_NEEDS_FIXED_SEGMENTS = {"max_split_size_mb", "garbage_collection_threshold"}


def alloc_conf_problem(text: str) -> str | None:
    """Why `text` is not a valid PYTORCH_NPU_ALLOC_CONF, or None."""
    options: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition(":"))
        if not sep or key not in _ALLOC_OPTIONS:
            return f"{item!r} is not option:value with option one of {', '.join(_ALLOC_OPTIONS)}"
        valid, wanted = _ALLOC_OPTIONS[key]
        if not valid(value):
            return f"{key} must be {wanted}, got {value!r}"
        options[key] = value
    if options.get("expandable_segments") == "True" and _NEEDS_FIXED_SEGMENTS & set(options):
        return "max_split_size_mb and garbage_collection_threshold need expandable_segments:False"
    return None


def _check_range(where: str, key: str, value: int, bounds: tuple[int, int], variable: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise ConfigError(where, key, f"{variable} must be within {bounds[0]}..{bounds[1]} (CANN), got {value}")


def _check_devices(where: str, spec: NpuSpec, devices_per_node: int) -> None:
    devices = spec.visible_devices
    if devices is None:
        return
    key = "environment.npu.visible_devices"
    if len(devices) != devices_per_node:
        raise ConfigError(where, key, f"lists {len(devices)} devices but slurm.devices_per_node is {devices_per_node}")
    if any(d < 0 for d in devices) or devices != sorted(set(devices)):
        raise ConfigError(where, key, f"must be distinct device ids >= 0 in ascending order (CANN), got {devices}")


def _check_network(where: str, spec: NpuSpec, nodes: int) -> None:
    for name in spec.socket_ifname:
        if not _IFNAME.match(name):
            raise ConfigError(where, "environment.npu.socket_ifname", f"{name!r} is not a network interface name")
    if spec.if_ip is None:
        return
    key = "environment.npu.if_ip"
    try:
        ipaddress.ip_address(spec.if_ip)
    except ValueError:
        raise ConfigError(where, key, f"{spec.if_ip!r} is not an IP address") from None
    if nodes > 1:
        raise ConfigError(where, key, "HCCL_IF_IP is one node's address; for several nodes set socket_ifname")
    if spec.socket_ifname:
        raise ConfigError(where, key, "set either if_ip or socket_ifname, not both")


def npu_variables(config: JobConfig) -> dict[str, str]:
    """The environment every NPU rank gets; validates `environment.npu` (ConfigError naming the key)."""
    where, spec, slurm = config.source, config.environment.npu, config.slurm
    _check_devices(where, spec, slurm.devices_per_node)
    _check_network(where, spec, slurm.nodes)
    _check_range(where, "environment.npu.connect_timeout_s", spec.connect_timeout_s, CONNECT_TIMEOUT_RANGE,
                 "HCCL_CONNECT_TIMEOUT")
    _check_range(where, "environment.npu.exec_timeout_s", spec.exec_timeout_s, EXEC_TIMEOUT_RANGE, "HCCL_EXEC_TIMEOUT")
    if spec.ports_per_device < 1:
        raise ConfigError(where, "environment.npu.ports_per_device", f"must be >= 1, got {spec.ports_per_device}")
    try:
        host, npu = hccl_port_ranges(spec, slurm.devices_per_node, (slurm.port_window[0], slurm.port_window[1]))
    except ValueError as error:
        raise ConfigError(where, "environment.npu.port_base", str(error)) from None
    if spec.alloc_conf is not None and (why := alloc_conf_problem(spec.alloc_conf)):
        raise ConfigError(where, "environment.npu.alloc_conf", f"PYTORCH_NPU_ALLOC_CONF: {why}")
    for name in _MANAGED:
        if name in config.environment.env:
            raise ConfigError(where, f"environment.env.{name}", "comes from environment.npu in NPU jobs; set it there")
    variables = {
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, visible_devices(spec, slurm.devices_per_node))),
        "HCCL_CONNECT_TIMEOUT": str(spec.connect_timeout_s),
        "HCCL_EXEC_TIMEOUT": str(spec.exec_timeout_s),
        "HCCL_HOST_SOCKET_PORT_RANGE": str(host),
        "HCCL_NPU_SOCKET_PORT_RANGE": str(npu),
    }
    if spec.socket_ifname:
        variables |= {"HCCL_SOCKET_IFNAME": "=" + ",".join(spec.socket_ifname),
                      "GLOO_SOCKET_IFNAME": ",".join(spec.socket_ifname)}
    if spec.if_ip:
        variables["HCCL_IF_IP"] = spec.if_ip
    if spec.alloc_conf:
        variables["PYTORCH_NPU_ALLOC_CONF"] = spec.alloc_conf
    return variables


def npu_setup_lines(spec: NpuSpec) -> list[str]:
    """Shell lines that source CANN (and NNAL's ATB when present) in the job, or stop it with a clear message."""
    text = render("npu_setup.sh.tmpl",
                  set_env_candidates=" ".join(shlex.quote(path) for path in set_env_candidates(spec)),
                  atb_set_env=shlex.quote(f"{spec.ascend_home}/nnal/atb/set_env.sh"),
                  exit_code=str(PREFLIGHT_EXIT_CODE))
    return text.rstrip("\n").splitlines()


def node_setup(config: JobConfig) -> tuple[list[str], dict[str, str]]:
    """What an NPU job adds to every node: set-up lines (CANN) and variables; nothing for other devices."""
    if config.environment.device != "npu":
        return [], {}
    return npu_setup_lines(config.environment.npu), npu_variables(config)
