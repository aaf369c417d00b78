"""What one node is: collected by running its tools (each with a timeout) and reading files; JSON both ways.

A fact that cannot be collected is None, with the reason under `problems[<check name>]` (e.g.
`problems["npu-smi"] = "npu-smi not on PATH"`). torch / torch_npu are imported only in a child process
(`python -m slurm_titan.doctor.probe_main`), so neither the supervisor nor the CLI loads them. `hccn_tool` (on
PATH or `<ascend home>/driver/tools/hccn_tool`, its default place) is optional: without it the device network
facts are None and nothing is recorded as a problem.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import slurm_titan
from slurm_titan.doctor import hccn_tool
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.hccn_tool import HccnDevice
from slurm_titan.doctor.npu_smi import (
    Chip,
    ChipProcess,
    NpuSmiInfo,
    parse_colon_fields,
    parse_key_values,
    parse_npu_smi_info,
)
from slurm_titan.doctor.ports import parse_port_list

NPU_SMI_TIMEOUT_S = 30.0
BUSY_POLL_S = 5.0
HCCN_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 300.0
KERNEL_CHECK_TIMEOUT_S = 600.0
PACKAGES = ("torch", "torch_npu", "torchtitan")
NET_DIR = "/sys/class/net"
RESERVED_PORTS_FILE = "/proc/sys/net/ipv4/ip_local_reserved_ports"
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DAVINCI = "/dev/davinci[0-9]*"
T = TypeVar("T")


@dataclass
class NodeFacts:
    """Everything the checks look at, for one node."""

    node_rank: int
    hostname: str
    device: str
    versions: dict[str, str | None]
    npu_smi: NpuSmiInfo | None = None
    firmware: dict[str, str] = field(default_factory=dict)
    cann_version: str | None = None
    cann_compatible: str | None = None
    """`compatible_version` of CANN's ascend_toolkit_install.info: the driver families it supports."""
    cann_ops_version: str | None = None
    driver: dict[str, str] | None = None
    """The driver's version.info (Version, Innerversion, compatible_version, ...)."""
    davinci: list[str] | None = None
    """The /dev/davinci<N> device files this node (or cgroup) gives the job."""
    device_count: int | None = None
    kernel_failures: list[str] | None = None
    """The failed verdict lines of the override checks on this node's NPU (doctor.check_kernels); None: not run."""
    network: dict[str, HccnDevice] | None = None
    """hccn_tool's view of every judged NPU's network port, by hccn_tool device id; None: no hccn_tool."""
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    memory_path: str | None = None
    memory_free_bytes: int | None = None
    """Free bytes of the RAM tier's file system (checkpoint.memory.dir)."""
    mem_available_bytes: int | None = None
    """/proc/meminfo's MemAvailable (the RAM tier on only)."""
    interfaces: list[str] | None = None
    ephemeral_range: tuple[int, int] | None = None
    reserved_ports: tuple[tuple[int, int], ...] | None = None
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.node_rank} ({self.hostname})"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeFacts:
        smi, network = data.get("npu_smi"), data.get("network")
        ephemeral, reserved = data.get("ephemeral_range"), data.get("reserved_ports")
        return cls(**{**data,
                      "npu_smi": None if smi is None else NpuSmiInfo(
                          smi["tool_version"], smi["driver_version"], tuple(Chip(**chip) for chip in smi["chips"]),
                          tuple(ChipProcess(**process) for process in smi.get("processes", ()))),
                      "network": None if network is None else {
                          device: HccnDevice(**port) for device, port in network.items()},
                      "ephemeral_range": None if ephemeral is None else tuple(ephemeral),
                      "reserved_ports": None if reserved is None else tuple(tuple(r) for r in reserved)})


class FactError(RuntimeError):
    """A fact could not be collected; the message says what was found instead."""


def run_tool(argv: list[str], timeout_s: float, name: str | None = None, *, check: bool = True) -> str:
    """stdout of a command; FactError naming a missing tool, a timeout or (`check`) a failure (with its last
    stderr line). `name` stands for the command in messages (default: the command line)."""
    if shutil.which(argv[0]) is None:
        raise FactError(f"{argv[0]} not on PATH")
    name = name or f"`{' '.join(argv)}`"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise FactError(f"{name} timed out after {timeout_s:.0f} s") from None
    if check and done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise FactError(f"{name} exited {done.returncode}: {last[0]}")
    return done.stdout


def package_versions() -> dict[str, str | None]:
    """python, slurm-titan and the training stack's versions (from package metadata: nothing is imported)."""
    versions: dict[str, str | None] = {"python": platform.python_version(), "slurm-titan": slurm_titan.__version__}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def free_space(path: str) -> tuple[str, int]:
    """Free bytes on the filesystem of `path` (measured at its nearest existing ancestor: it may not exist yet)."""
    place = Path(path).absolute()
    while not place.exists():
        place = place.parent
    return str(place), shutil.disk_usage(place).free


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """The kernel's estimate of the memory available to new work (MemAvailable), in bytes."""
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo} has no MemAvailable")


def cann_install(ascend_home: str, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """CANN's `<toolkit home>/<arch>-linux/ascend_toolkit_install.info` (its path and `key=value` fields, with a
    `version`), the toolkit home being $ASCEND_HOME_PATH once set_env.sh ran, else the newest layout
    <ascend_home>/cann (8.5+), then <ascend_home>/ascend-toolkit/latest (<= 8.3), as the job's set-up sources them."""
    info = Path(f"{platform.machine()}-linux") / "ascend_toolkit_install.info"
    homes = [home for home in (env.get("ASCEND_HOME_PATH"), f"{ascend_home}/cann",
                               f"{ascend_home}/ascend-toolkit/latest") if home]
    for path in (Path(home) / info for home in homes):
        if path.is_file():
            fields = parse_key_values(path.read_text(encoding="utf-8", errors="replace"))
            if fields.get("version"):
                return path, fields
            raise FactError(f"{path} has no version= line")
    raise FactError(f"no {info} under {', '.join(homes)}")


def cann_ops_version(toolkit_info: Path) -> str:
    """The version of CANN's ops (kernels) package next to the toolkit whose install info is `toolkit_info`:
    `version=` of `<arch>-linux/ascend_ops_install.info` (CANN 8.5+, quick-install docs: "cat
    /usr/local/Ascend/cann/${arch}-linux/ascend_ops_install.info"), else `version_dir=` of the kernels
    package's `<toolkit home>/opp_kernel/version.info` (<= 8.3; its `Version=` is a build number)."""
    ops = toolkit_info.with_name("ascend_ops_install.info")
    kernels = toolkit_info.parent.parent / "opp_kernel" / "version.info"
    for path, key in ((ops, "version"), (kernels, "version_dir")):
        if path.is_file():
            version = parse_key_values(path.read_text(encoding="utf-8", errors="replace")).get(key)
            if version:
                return version
            raise FactError(f"{path} has no {key}= line")
    raise FactError(f"no {ops.name} (CANN 8.5+) in {ops.parent} nor {kernels}: the ops (kernels) package "
                    "for this chip is not installed")


def driver_info(ascend_home: str) -> dict[str, str]:
    """The driver's `<ascend_home>/driver/version.info` fields (containers must mount it)."""
    path = Path(ascend_home) / "driver" / "version.info"
    if not path.is_file():
        raise FactError(f"no {path}")
    return parse_key_values(path.read_text(encoding="utf-8", errors="replace"))


def hccn_tool_path(ascend_home: str) -> str | None:
    """hccn_tool on PATH, else at its default place under the driver; None when it is not installed."""
    default = Path(ascend_home) / "driver" / "tools" / "hccn_tool"
    return shutil.which("hccn_tool") or (str(default) if os.access(default, os.X_OK) else None)


def network_port(tool: str, device: str) -> HccnDevice:
    """One NPU's IP, link state, network health and TLS switch (a query that fails leaves its field None)."""
    def query(parse: Callable[[str], T], *args: str) -> T | None:
        try:
            return parse(run_tool([tool, "-i", device, *args], HCCN_TIMEOUT_S))
        except FactError:
            return None

    return HccnDevice(query(hccn_tool.parse_ip, "-ip", "-g"), query(hccn_tool.parse_link, "-link", "-g"),
                      query(hccn_tool.parse_net_health, "-net_health", "-g"),
                      query(hccn_tool.parse_tls_switch, "-tls", "-g"))


def ping_device(ascend_home: str, device: str, address: str) -> tuple[int, int]:
    """(transmitted, received) of `hccn_tool -i <device> -ping -g address <address>` (its source returns an
    error when a packet times out, so the output is read whatever the exit status)."""
    tool = hccn_tool_path(ascend_home)
    if tool is None:
        raise FactError("hccn_tool is not installed")
    return hccn_tool.parse_ping(run_tool([tool, "-i", device, "-ping", "-g", "address", address],
                                         HCCN_TIMEOUT_S, check=False))


def network_ids(smi: NpuSmiInfo, visible: tuple[int, ...]) -> list[str]:
    """hccn_tool's device ids of the judged chips: the Phy-ID on A3 (two dies per NPU), else the NPU id."""
    return [str(chip.npu_id if chip.phy_id is None else chip.phy_id) for chip in smi.judged(visible)]


def read_ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    with open(path, encoding="ascii") as handle:
        low, high = handle.read().split()
    return int(low), int(high)


def read_reserved_ports(path: str = RESERVED_PORTS_FILE) -> tuple[tuple[int, int], ...]:
    with open(path, encoding="ascii") as handle:
        return parse_port_list(handle.read())


def probe_device_count() -> int:
    """torch.npu.device_count() as the ranks will see it (same Python, same environment), in a child process."""
    out = run_tool([sys.executable, "-m", "slurm_titan.doctor.probe_main"], PROBE_TIMEOUT_S, "the torch_npu probe")
    try:
        return int(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise FactError(f"the torch_npu probe printed {out.strip()[-200:]!r}") from None


def probe_kernels() -> list[str]:
    """The failed verdict lines (`FAIL <check> <dtype>: ...`) of `check-overrides --device npu`'s quick checks on
    this node's first NPU, in a child process (same Python and environment as the ranks)."""
    out = run_tool([sys.executable, "-m", "slurm_titan.overrides.check"], KERNEL_CHECK_TIMEOUT_S,
                   "the NPU kernel check")
    return [line.removeprefix("FAIL ").strip() for line in out.splitlines() if line.startswith("FAIL ")]


def _collect(facts: NodeFacts, check: str, collect: Callable[[], T]) -> T | None:
    """collect() or None, recording why under problems[check]."""
    try:
        return collect()
    except (FactError, OSError, ValueError) as error:
        facts.problems[check] = str(error)
        return None


def _npu_smi_info() -> NpuSmiInfo:
    return parse_npu_smi_info(run_tool(["npu-smi", "info"], NPU_SMI_TIMEOUT_S))


def wait_until_released(read: Callable[[], NpuSmiInfo], visible: tuple[int, ...], wait_s: float,
                        poll_s: float = BUSY_POLL_S, clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> NpuSmiInfo:
    """`read()` (npu-smi info), read again every `poll_s` while a chip of `visible` is busy, until none is or
    `wait_s` have passed: the last reading."""
    deadline = clock() + wait_s
    info = read()
    while any(chip.busy for chip in info.judged(visible)) and clock() < deadline:
        sleep(poll_s)
        info = read()
    return info


def _board(npu_id: int) -> dict[str, str]:
    return parse_colon_fields(run_tool(["npu-smi", "info", "-t", "board", "-i", str(npu_id)], NPU_SMI_TIMEOUT_S))


def _collect_npu(facts: NodeFacts, expect: DoctorExpectations) -> None:
    facts.npu_smi = _collect(facts, "npu-smi", partial(wait_until_released, _npu_smi_info, expect.visible_devices,
                                                      expect.busy_wait_s))
    for npu_id in dict.fromkeys(chip.npu_id for chip in facts.npu_smi.chips) if facts.npu_smi else ():
        board = _collect(facts, "firmware", partial(_board, npu_id))
        if board is not None and board.get("Firmware Version"):
            facts.firmware[str(npu_id)] = board["Firmware Version"]
    install = _collect(facts, "CANN", partial(cann_install, expect.ascend_home, dict(os.environ)))
    if install is not None:
        path, fields = install
        facts.cann_version, facts.cann_compatible = fields["version"], fields.get("compatible_version")
        facts.cann_ops_version = _collect(facts, "CANN ops", partial(cann_ops_version, path))
    facts.driver = _collect(facts, "driver version", partial(driver_info, expect.ascend_home))
    facts.davinci = sorted(os.path.basename(path) for path in glob.glob(DAVINCI))
    facts.device_count = _collect(facts, "device count", probe_device_count)
    if expect.check_kernels:
        facts.kernel_failures = _collect(facts, "NPU kernels", probe_kernels)
    tool = hccn_tool_path(expect.ascend_home)
    if tool is not None and facts.npu_smi is not None:
        facts.network = {device: network_port(tool, device)
                         for device in network_ids(facts.npu_smi, expect.visible_devices)}


def collect_facts(expect: DoctorExpectations, node_rank: int) -> NodeFacts:
    """This node's facts: versions, and what `expect` asks about: checkpoint disk, network interfaces, the
    ephemeral and reserved port ranges; with device npu also npu-smi (read again while a judged chip is busy, up
    to `expect.busy_wait_s`: `wait_until_released`), firmware, CANN and its ops package, the
    driver's version.info, /dev/davinci*, torch_npu's device count, (`check_kernels`) the override checks on its
    first NPU and (with hccn_tool) the NPUs' network."""
    facts = NodeFacts(node_rank, socket.gethostname(), expect.device, package_versions())
    if expect.checkpoint_dir is not None:
        place = _collect(facts, "disk", partial(free_space, expect.checkpoint_dir))
        if place is not None:
            facts.disk_path, facts.disk_free_bytes = place
    if expect.memory_dir is not None:
        place = _collect(facts, "RAM tier", partial(free_space, expect.memory_dir))
        if place is not None:
            facts.memory_path, facts.memory_free_bytes = place
    if expect.memory_dir is not None or expect.standby_bytes:
        facts.mem_available_bytes = _collect(facts, "host memory", mem_available)
    if expect.socket_ifnames:
        facts.interfaces = _collect(facts, "network interface", lambda: sorted(os.listdir(NET_DIR)))
    if expect.hccl_port_ranges:
        facts.ephemeral_range = _collect(facts, "HCCL ports", read_ephemeral_range)
        facts.reserved_ports = _collect(facts, "HCCL ports", read_reserved_ports)
    if expect.device == "npu":
        _collect_npu(facts, expect)
    return facts
