"""The node environment of an NPU job, generated from `environment.npu` and `timeouts`, checked against the
documented ranges of CANN and torch_npu.

Sources (CANN 8.x environment variable reference, hiascend.com `envref_07_*` / `hcclenvref_07_*`; Ascend
Extension for PyTorch (torch_npu) environment variable reference, Ascend/pytorch
`docs/zh/environment_variable_reference/*.md`):

- `set_env.sh`: `<ascend>/cann/set_env.sh` (CANN 8.5+), `<ascend>/ascend-toolkit/set_env.sh` (<= 8.3), NNAL's
  ATB library `<ascend>/nnal/atb/set_env.sh`. A node that keeps both CANN layouts (an upgrade leaves the old one)
  sources the newest. A batch shell does not read ~/.bashrc, and submitit's set-up lines
  run on the batch host only, so every node's task sources them itself before its supervisor starts
  (`cann_launcher`). set_env.sh only sets CANN's own paths (prepending to LD_LIBRARY_PATH, PATH, PYTHONPATH), so
  the variables below, exported by the batch script and passed on by srun, keep their values.
- ASCEND_RT_VISIBLE_DEVICES: logical device ids, comma-separated, ascending, nothing else in the value.
- HCCL_CONNECT_TIMEOUT: integer seconds in [120, 7200]. HCCL_EXEC_TIMEOUT: integer seconds in
  [0, 2147483647] on Atlas A2/A3 (0: never); with HCCL_OP_EXPANSION_MODE=AIV at most 1091.
- HCCL_IF_IP (one address) outranks HCCL_SOCKET_IFNAME; `=a,b` selects exactly interface a or b.
  GLOO_SOCKET_IFNAME takes plain comma-separated names (torch.distributed).
- HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE: `low-high` within [1, 65535] (1-1023 reserved),
  no fewer ports than HCCL processes per NPU; without them the ranks of one node can collide on the default
  ports (EI0020, Communication_Error_Bind_IP_Port). Here: one node-wide block of `ports_per_device` ports per
  device each. HCCL_IF_BASE_PORT: the first of the host ports HCCL's root-info (rank-table-free) bootstrap
  listens on, 32 of them from CANN 8.2; its default 60000-60031 lies in the kernel's default ephemeral range,
  which CANN says to reserve (`sysctl -w net.ipv4.ip_local_reserved_ports=60000-60031`). All three blocks are
  kept outside `slurm.port_window` (the master port) and the ephemeral range (checked again on every node by
  the doctor against its own /proc/sys/net/ipv4/ip_local_port_range).
- PYTORCH_NPU_ALLOC_CONF (torch_npu): `option:value,...`; max_split_size_mb > 20, garbage_collection_threshold
  in (0, 1), expandable_segments True/False, base_addr_aligned_kb 0..16, page_size 1g, segment_size_mb > 0;
  a non-default max_split_size_mb or garbage_collection_threshold needs expandable_segments:False.
- TASK_QUEUE_ENABLE (torch_npu): 0 off, 1 (torch_npu's default) level 1, 2 level 2 (balances the two launch
  pipeline stages; recommended for host-bound nets). STREAMS_PER_DEVICE: 8 or 32 (any other value: a warning and
  32). CPU_AFFINITY_CONF: `<mode>[,npu<i>:<a>-<b>]...[,npu_affine:<0|1>][,force:<0|1>]`, mode 0 (torch_npu's
  default: no binding), 1 (each device's threads bound to its block of cores: all cores split evenly over the
  node's NPUs, or the `npu<i>:<a>-<b>` ranges given for device i, which may repeat: their union), 2 (1 plus the
  hot threads pinned to fixed cores of the block). torch_npu 2.14 skips the binding of a process that already
  runs on a narrower CPU set ("Thread affinity is already set. Use force:1") unless `force:1`.
  HCCL_BUFFSIZE (CANN): integer MB >= 1 (default 200). hicann/torchtitan-npu's
  `scripts/run_train_multinodes.sh` exports TASK_QUEUE_ENABLE=2, CPU_AFFINITY_CONF=1 and STREAMS_PER_DEVICE=32:
  the defaults here (it also exports MULTI_STREAM_MEMORY_RESERVE=1, which torch_npu 2.14.0 does not read: the
  name is absent from its library, so it is not set).
- Flight recorder and async errors: ProcessGroupHCCL reads TORCH_HCCL_TRACE_BUFFER_SIZE,
  TORCH_HCCL_DUMP_ON_TIMEOUT (dump on a watchdog timeout or error; needs TORCH_HCCL_ENABLE_MONITORING=1 and a
  trace buffer), TORCH_HCCL_DEBUG_INFO_TEMP_FILE (file prefix, rank appended) and
  TORCH_HCCL_ASYNC_ERROR_HANDLING (0 off, 1 on; the old HCCL_ASYNC_ERROR_HANDLING is deprecated in 2.14.0, and
  left out of the job); it ignores the NCCL names torchtitan sets from `comm.trace_buf_size` /
  `comm.save_traces_folder` (torchtitan/distributed/utils.py), so they are set here from the same torchtitan
  options. HCCL_DETERMINISTIC=true follows torchtitan's `debug.deterministic`.
- ProcessGroupHCCL's default timeout (30 min) counts as unset: a process group created with exactly 1800 s
  gets HCCL_EXEC_TIMEOUT + 1800 s instead (ProcessGroupHCCL.cpp), so `timeouts.startup_s` may not be 1800.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_titan.cpulist import parse_cpu_list
from slurm_titan.errors import ConfigError, ExitCode
from slurm_titan.launch.templating import render

LINUX_EPHEMERAL = (32768, 60999)
"""The kernel's default net.ipv4.ip_local_port_range, assumed at plan time."""
CONNECT_TIMEOUT_RANGE = (120, 7200)
EXEC_TIMEOUT_RANGE = (0, 2_147_483_647)
AIV_EXEC_TIMEOUT_MAX = 1091
HCCL_PG_DEFAULT_TIMEOUT_S = 1800
"""ProcessGroupHCCL's DEFAULT_TIMEOUT, which torch_npu replaces with HCCL_EXEC_TIMEOUT + 1800 s."""
DUMP_MARGIN_S = 120
"""How much longer HCCL_EXEC_TIMEOUT waits than torch's watchdog: time for the flight-recorder dump
(TORCH_HCCL_WAIT_TIMEOUT_DUMP_MILSEC, 60 s by default) before the device-side timeout fires."""
IF_BASE_PORTS = 32
"""Ports HCCL_IF_BASE_PORT's block holds (CANN >= 8.2)."""
PORT_FLOOR = 1024
PORT_CEILING = 65535
TASK_QUEUE_LEVELS = (0, 1, 2)
STREAM_POOL_SIZES = (8, 32)
TITAN_COMM_DEFAULTS = {"comm.trace_buf_size": 20000, "comm.save_traces_folder": "comm_traces",
                       "comm.save_traces_file_prefix": "rank_"}
"""torchtitan 0.3.0's CommConfig defaults for the flight recorder (torchtitan/config/configs.py)."""
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_AFFINITY_RANGE = re.compile(r"^npu(\d+):(\d+)-(\d+)$")
_AFFINITY_SWITCH = re.compile(r"^(npu_affine|force):([01])$")
_MANAGED = ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
            "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_HOST_SOCKET_PORT_RANGE",
            "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_IF_BASE_PORT", "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE",
            "CPU_AFFINITY_CONF", "STREAMS_PER_DEVICE", "HCCL_BUFFSIZE", "TORCH_HCCL_TRACE_BUFFER_SIZE",
            "TORCH_HCCL_DUMP_ON_TIMEOUT", "TORCH_HCCL_ENABLE_MONITORING", "TORCH_HCCL_DEBUG_INFO_TEMP_FILE",
            "TORCH_HCCL_ASYNC_ERROR_HANDLING", "HCCL_ASYNC_ERROR_HANDLING", "HCCL_DETERMINISTIC", "PYTORCH_ALLOC_CONF")
"""The variables `environment.npu` owns: refused in `environment.env`, unset in the batch script when the job
does not set them (`left_out`). PYTORCH_ALLOC_CONF is never set: torch_npu refuses it next to
PYTORCH_NPU_ALLOC_CONF ("Both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF have been set") at a rank's first
allocation; nor is HCCL_ASYNC_ERROR_HANDLING, the deprecated name of TORCH_HCCL_ASYNC_ERROR_HANDLING."""


@dataclass
class NpuSpec:
    """`environment.npu`: where CANN is and how HCCL / torch_npu are set up on every node.

    `set_env` pins CANN's set_env.sh (default: the first of `<ascend_home>/cann/set_env.sh` (8.5+) and
    `<ascend_home>/ascend-toolkit/set_env.sh` (<= 8.3) that exists on the node). `visible_devices` defaults to
    0..devices_per_node-1. `socket_ifname` names the NICs for HCCL's and gloo's bootstrap; `if_ip` is for one-node
    jobs only (one node's address). `port_base` pins the first HCCL socket port and `if_base_port`
    HCCL_IF_BASE_PORT (default: both computed, in one block with the socket ports). The timeouts come from the
    job's `timeouts` section.

    Performance settings (torchtitan-npu's values by default): `task_queue` (TASK_QUEUE_ENABLE, 2),
    `cpu_affinity` (CPU_AFFINITY_CONF, "1"; null leaves binding off), `streams_per_device` (32),
    `hccl_buffsize_mb` (HCCL_BUFFSIZE; null: CANN's 200).
    A binding mode without a `force:` item of its own gets `force:1` when Slurm confines the task to
    `slurm.cpus_per_node` CPUs (`affinity_conf`): torch_npu would skip the binding otherwise.
    With binding on, `checkpoint.upload_cpus` must lie outside the cores torch_npu binds the ranks to: mode 1/2
    splits all of a node's cores over its NPUs, so only per-device ranges (`"1,npu0:0-21,npu1:24-45,..."`,
    logical device ids as torch_npu numbers them) can leave cores free; the plan checks the upload CPUs
    against them (see `affinity_problem`).
    The preflight warns at `temp_warn_c` (75) and fails at `temp_fail_c` (85 C: the NPU throttles).
    """

    ascend_home: str = "/usr/local/Ascend"
    set_env: str | None = None
    visible_devices: list[int] | None = None
    socket_ifname: list[str] = field(default_factory=list)
    if_ip: str | None = None
    port_base: int | None = None
    ports_per_device: int = 16
    if_base_port: int | None = None
    alloc_conf: str | None = "expandable_segments:True"
    task_queue: int = 2
    cpu_affinity: str | None = "1"
    streams_per_device: int = 32
    hccl_buffsize_mb: int | None = None
    temp_warn_c: int = 75
    temp_fail_c: int = 85


@dataclass(frozen=True)
class NpuJob:
    """What the NPU environment depends on outside `environment.npu`; this module never sees the whole job
    config (`launch.config.JobConfig.npu_job` fills it in).

    `where` names the config in errors; `port_window` is `slurm.port_window`; `startup_s` and `collective_s`
    are the `timeouts`; `env` is `environment.env`; `upload_cpus` is `checkpoint.upload_cpus`;
    `titan_option(dotted, default)` reads a torchtitan option (`TorchtitanSpec.option`); `cpus_per_node` is
    `slurm.cpus_per_node`.
    """

    where: str
    nodes: int
    devices_per_node: int
    port_window: tuple[int, int]
    startup_s: int
    collective_s: int
    env: Mapping[str, str]
    upload_cpus: str | None
    titan_option: Callable[[str, Any], Any]
    cpus_per_node: int | None


@dataclass(frozen=True)
class PortRange:
    """An inclusive range of TCP ports."""

    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def overlaps(self, low: int, high: int) -> bool:
        return self.low <= high and low <= self.high


class PortError(ValueError):
    """No valid placement of the HCCL ports; `key` is the config key to change."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key


def set_env_candidates(spec: NpuSpec) -> list[str]:
    """CANN set_env.sh paths the job tries, in order: the newest layout (8.5+) first."""
    if spec.set_env:
        return [spec.set_env]
    return [f"{spec.ascend_home}/cann/set_env.sh", f"{spec.ascend_home}/ascend-toolkit/set_env.sh"]


def visible_devices(spec: NpuSpec, devices_per_node: int) -> list[int]:
    return list(range(devices_per_node)) if spec.visible_devices is None else list(spec.visible_devices)


def hccl_port_ranges(spec: NpuSpec, devices_per_node: int, port_window: tuple[int, int],
                     ephemeral: tuple[int, int] = LINUX_EPHEMERAL) -> tuple[PortRange, PortRange, PortRange]:
    """The (host, NPU, HCCL_IF_BASE_PORT) port ranges of every node: two adjacent blocks of ports_per_device
    ports per device, then the 32 root-info ports (unless `if_base_port` pins them elsewhere).

    Placed at `port_base`, or else just above the ephemeral range, above the port window, or from 1024 (the
    first that fits). PortError says why no placement fits and which key to change.
    """
    size = devices_per_node * spec.ports_per_device
    forbidden = {"slurm.port_window": port_window, "the kernel's ephemeral range": ephemeral}

    def outside(ranges: list[PortRange], avoid: dict[str, tuple[int, int]]) -> str | None:
        low, high = min(r.low for r in ranges), max(r.high for r in ranges)
        if low < PORT_FLOOR or high > PORT_CEILING:
            return f"ports {low}-{high} leave {PORT_FLOOR}-{PORT_CEILING}"
        clashes = [f"{name} {first}-{last}" for name, (first, last) in avoid.items()
                   if any(r.overlaps(first, last) for r in ranges)]
        return f"ports {low}-{high} overlap {' and '.join(clashes)}" if clashes else None

    pinned_root = None
    if spec.if_base_port is not None:
        pinned_root = PortRange(spec.if_base_port, spec.if_base_port + IF_BASE_PORTS - 1)
        if why := outside([pinned_root], forbidden):
            raise PortError("environment.npu.if_base_port", f"HCCL_IF_BASE_PORT: {why}")
        forbidden = forbidden | {"environment.npu.if_base_port": (pinned_root.low, pinned_root.high)}

    def blocks(base: int) -> tuple[PortRange, PortRange, PortRange]:
        root = pinned_root or PortRange(base + 2 * size, base + 2 * size + IF_BASE_PORTS - 1)
        return PortRange(base, base + size - 1), PortRange(base + size, base + 2 * size - 1), root

    def problem(base: int) -> str | None:
        host, npu, root = blocks(base)
        return outside([host, npu] if pinned_root else [host, npu, root], forbidden)

    if spec.port_base is not None:
        if why := problem(spec.port_base):
            raise PortError("environment.npu.port_base", why)
        return blocks(spec.port_base)
    for base in (ephemeral[1] + 1, port_window[1] + 1, PORT_FLOOR):
        if problem(base) is None:
            return blocks(base)
    raise PortError("environment.npu.port_base",
                    f"no room for {2 * size} HCCL ports ({devices_per_node} devices x {spec.ports_per_device} "
                    f"x host+NPU) and {IF_BASE_PORTS} root-info ports outside slurm.port_window and the "
                    "ephemeral range; lower ports_per_device")


def hccl_timeouts(startup_s: int, collective_s: int) -> tuple[int, int]:
    """(HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT) derived from `timeouts` (see config.TimeoutSpec for the order)."""
    return startup_s, max(startup_s, collective_s) + DUMP_MARGIN_S


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


@dataclass(frozen=True)
class Affinity:
    """A parsed CPU_AFFINITY_CONF: the mode, the cores given per logical device, and `force:` (None: not given)."""

    mode: int
    ranges: dict[int, frozenset[int]]
    force: bool | None = None


def parse_affinity(text: str) -> Affinity:
    """CPU_AFFINITY_CONF `<mode>[,npu<i>:<a>-<b>]...[,npu_affine:<0|1>][,force:<0|1>]`, a device's repeated
    ranges joined; ValueError (one line) if malformed."""
    mode, *items = (item.strip() for item in text.split(","))
    if mode not in ("0", "1", "2"):
        raise ValueError(f"mode {mode!r} must be 0, 1 or 2")
    ranges: dict[int, frozenset[int]] = {}
    force = None
    for item in items:
        if switch := _AFFINITY_SWITCH.match(item):
            if switch[1] == "force":
                force = switch[2] == "1"
            continue
        match = _AFFINITY_RANGE.match(item)
        if not match or int(match[2]) > int(match[3]):
            raise ValueError(f"{item!r} is not npu<device>:<first>-<last> (first <= last), npu_affine:<0|1> "
                             "or force:<0|1>")
        device = int(match[1])
        ranges[device] = ranges.get(device, frozenset()) | frozenset(range(int(match[2]), int(match[3]) + 1))
    return Affinity(int(mode), ranges, force)


def affinity_conf(text: str, cpus_per_node: int | None) -> str:
    """CPU_AFFINITY_CONF for `environment.npu.cpu_affinity` `text` (valid): `force:1` added to a binding mode
    without a `force:` item when Slurm confines the task to `cpus_per_node` CPUs, a narrower set than the
    node's, on which torch_npu skips the binding unless forced."""
    affinity = parse_affinity(text)
    if affinity.mode == 0 or affinity.force is not None or cpus_per_node is None:
        return text
    return f"{text},force:1"


def affinity_problem(affinity: Affinity, upload_cpus: frozenset[int], devices_per_node: int) -> str | None:
    """Why the uploader's CPUs may share cores torch_npu binds a rank to, or None.

    Modes 1 and 2 give each device without an explicit range an equal share of all the node's cores, which
    covers every core, so every device needs a range, and none may hold an upload CPU.
    """
    if affinity.mode == 0:
        return None
    missing = [device for device in range(devices_per_node) if device not in affinity.ranges]
    if missing:
        return (f"CPU_AFFINITY_CONF mode {affinity.mode} binds device {missing[0]} to its share of all cores, which "
                "can hold these CPUs: give every device a range (environment.npu.cpu_affinity "
                "'1,npu0:<a>-<b>,...') or set environment.npu.cpu_affinity to '0'")
    for device, cores in sorted(affinity.ranges.items()):
        if shared := cores & upload_cpus:
            return f"CPU {min(shared)} is also in device {device}'s range of environment.npu.cpu_affinity"
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


def _check_timeouts(job: NpuJob) -> tuple[int, int]:
    where = job.where
    connect, execute = hccl_timeouts(job.startup_s, job.collective_s)
    default = HCCL_PG_DEFAULT_TIMEOUT_S
    if job.startup_s == default:
        raise ConfigError(where, "timeouts.startup_s",
                          f"{default} s is ProcessGroupHCCL's default timeout, which torch_npu replaces with "
                          f"HCCL_EXEC_TIMEOUT + {default} s ({execute + default} s), so HCCL_EXEC_TIMEOUT would fire "
                          "before torch's watchdog at start-up; use another value (1790 by default)")
    _check_range(where, "timeouts.startup_s", connect, CONNECT_TIMEOUT_RANGE, "HCCL_CONNECT_TIMEOUT")
    _check_range(where, "timeouts.collective_s", execute, EXEC_TIMEOUT_RANGE, "HCCL_EXEC_TIMEOUT")
    if job.env.get("HCCL_OP_EXPANSION_MODE") == "AIV" and execute > AIV_EXEC_TIMEOUT_MAX:
        raise ConfigError(where, "timeouts.collective_s",
                          f"HCCL_OP_EXPANSION_MODE=AIV caps HCCL_EXEC_TIMEOUT at {AIV_EXEC_TIMEOUT_MAX} s (CANN), "
                          f"below the {execute} s torch's watchdog needs first; keep timeouts at most "
                          f"{AIV_EXEC_TIMEOUT_MAX - DUMP_MARGIN_S} s")
    return connect, execute


def _check_performance(spec: NpuSpec, job: NpuJob) -> None:
    where = job.where
    if spec.task_queue not in TASK_QUEUE_LEVELS:
        raise ConfigError(where, "environment.npu.task_queue",
                          f"TASK_QUEUE_ENABLE must be 0, 1 or 2 (torch_npu), got {spec.task_queue}")
    if spec.streams_per_device not in STREAM_POOL_SIZES:
        raise ConfigError(where, "environment.npu.streams_per_device",
                          f"STREAMS_PER_DEVICE must be 8 or 32 (torch_npu), got {spec.streams_per_device}")
    if spec.hccl_buffsize_mb is not None and spec.hccl_buffsize_mb < 1:
        raise ConfigError(where, "environment.npu.hccl_buffsize_mb",
                          f"HCCL_BUFFSIZE must be >= 1 MB (CANN), got {spec.hccl_buffsize_mb}")
    if spec.cpu_affinity is None:
        return
    try:
        affinity = parse_affinity(spec.cpu_affinity)
    except ValueError as error:
        raise ConfigError(where, "environment.npu.cpu_affinity", f"CPU_AFFINITY_CONF: {error}") from None
    upload = job.upload_cpus
    if upload is not None and (why := affinity_problem(affinity, parse_cpu_list(upload), job.devices_per_node)):
        raise ConfigError(where, "checkpoint.upload_cpus", why)


def _flight_recorder(option: Callable[[str, Any], Any], dump_folder: str) -> dict[str, str]:
    """torchtitan's flight-recorder and async-error settings (`option`: NpuJob.titan_option) under
    ProcessGroupHCCL's names."""
    size = option("comm.trace_buf_size", TITAN_COMM_DEFAULTS["comm.trace_buf_size"])
    variables = {"TORCH_HCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_HCCL_TRACE_BUFFER_SIZE": str(size)}
    if int(size) > 0:  # torchtitan creates <dump_folder>/<save_traces_folder> before the process group
        folder = option("comm.save_traces_folder", TITAN_COMM_DEFAULTS["comm.save_traces_folder"])
        prefix = option("comm.save_traces_file_prefix", TITAN_COMM_DEFAULTS["comm.save_traces_file_prefix"])
        variables |= {"TORCH_HCCL_DUMP_ON_TIMEOUT": "1", "TORCH_HCCL_ENABLE_MONITORING": "1",
                      "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": f"{dump_folder}/{folder}/{prefix}"}
    return variables


def check_npu(spec: NpuSpec, job: NpuJob) -> tuple[PortRange, PortRange, PortRange]:
    """Validate `environment.npu` and the HCCL side of `timeouts` (ConfigError naming the key); the ports."""
    where = job.where
    _check_devices(where, spec, job.devices_per_node)
    _check_network(where, spec, job.nodes)
    _check_timeouts(job)
    if spec.ports_per_device < 1:
        raise ConfigError(where, "environment.npu.ports_per_device", f"must be >= 1, got {spec.ports_per_device}")
    try:
        ports = hccl_port_ranges(spec, job.devices_per_node, job.port_window)
    except PortError as error:
        raise ConfigError(where, error.key, str(error)) from None
    if spec.alloc_conf is not None and (why := alloc_conf_problem(spec.alloc_conf)):
        raise ConfigError(where, "environment.npu.alloc_conf", f"PYTORCH_NPU_ALLOC_CONF: {why}")
    _check_performance(spec, job)
    if not 0 < spec.temp_warn_c < spec.temp_fail_c:
        raise ConfigError(where, "environment.npu.temp_warn_c",
                          f"must be above 0 and below temp_fail_c={spec.temp_fail_c}, got {spec.temp_warn_c}")
    for name in _MANAGED:
        if name in job.env:
            raise ConfigError(where, f"environment.env.{name}", "comes from environment.npu in NPU jobs; set it there")
    return ports


def npu_variables(spec: NpuSpec, job: NpuJob, dump_folder: str) -> dict[str, str]:
    """The environment every NPU rank gets (flight-recorder dumps under torchtitan's `dump_folder`);
    validates first (`check_npu`)."""
    host, npu, root = check_npu(spec, job)
    connect, execute = hccl_timeouts(job.startup_s, job.collective_s)
    variables = {
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, visible_devices(spec, job.devices_per_node))),
        "HCCL_CONNECT_TIMEOUT": str(connect),
        "HCCL_EXEC_TIMEOUT": str(execute),
        "HCCL_HOST_SOCKET_PORT_RANGE": str(host),
        "HCCL_NPU_SOCKET_PORT_RANGE": str(npu),
        "HCCL_IF_BASE_PORT": str(root.low),
        "TASK_QUEUE_ENABLE": str(spec.task_queue),
        "STREAMS_PER_DEVICE": str(spec.streams_per_device),
    } | _flight_recorder(job.titan_option, dump_folder)
    affinity = None if spec.cpu_affinity is None else affinity_conf(spec.cpu_affinity, job.cpus_per_node)
    optional = {"HCCL_IF_IP": spec.if_ip, "PYTORCH_NPU_ALLOC_CONF": spec.alloc_conf,
                "CPU_AFFINITY_CONF": affinity, "HCCL_BUFFSIZE": spec.hccl_buffsize_mb}
    variables |= {name: str(value) for name, value in optional.items() if value is not None}
    if spec.socket_ifname:
        variables |= {"HCCL_SOCKET_IFNAME": "=" + ",".join(spec.socket_ifname),
                      "GLOO_SOCKET_IFNAME": ",".join(spec.socket_ifname)}
    if job.titan_option("debug.deterministic", False):
        variables["HCCL_DETERMINISTIC"] = "true"
    return variables


def left_out(variables: Mapping[str, str]) -> list[str]:
    """The managed variables an NPU job with `variables` does not set. Its batch script unsets them after the
    set-up lines, so that none reaches the ranks from the submitting shell (sbatch exports it by default, and
    srun passes the batch shell's environment on) or from a set-up line."""
    return [name for name in _MANAGED if name not in variables]


def inherited_warning(environ: Mapping[str, str], unset: list[str]) -> str | None:
    """One line naming the variables of the submitting shell `environ` that the batch script unsets (`unset`,
    from `left_out`), or None."""
    names = [name for name in unset if name in environ]
    if not names:
        return None
    return (f"{', '.join(names)} from this shell left out of the NPU job: environment.npu sets these (torch_npu "
            "stops every rank on PYTORCH_ALLOC_CONF next to PYTORCH_NPU_ALLOC_CONF; allocator options go in "
            "environment.npu.alloc_conf)")


def cann_launcher(spec: NpuSpec) -> str:
    """Words that run the rest of a command line after sourcing CANN (and NNAL's ATB when present) on the node
    the command runs on, or stop it there with a clear message (exit code ExitCode.PREFLIGHT)."""
    script = render("npu_setup.sh.tmpl",
                    set_env_candidates=" ".join(shlex.quote(path) for path in set_env_candidates(spec)),
                    atb_set_env=shlex.quote(f"{spec.ascend_home}/nnal/atb/set_env.sh"),
                    exit_code=str(ExitCode.PREFLIGHT))
    return f"bash -c {shlex.quote(script.rstrip(chr(10)))} slurm-titan-cann"


def node_setup(spec: NpuSpec, job: NpuJob, dump_folder: str) -> tuple[str, dict[str, str]]:
    """What an NPU job adds to every node: the launcher prefix (CANN) and the variables."""
    return cann_launcher(spec) + " ", npu_variables(spec, job, dump_folder)
