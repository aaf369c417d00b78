"""What one node is: collected by running its tools (each with a timeout) and reading files; JSON both ways.

A fact that cannot be collected is None, with the reason under `problems[<check name>]` (e.g.
`problems["npu-smi"] = "npu-smi not on PATH"`). torch / torch_npu are imported only in a child process
(`python -m slurm_titan.doctor.probe`), so neither the supervisor nor the CLI loads them.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import slurm_titan
from slurm_titan import rendezvous
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.npu_smi import (
    Chip,
    NpuSmiInfo,
    parse_colon_fields,
    parse_key_values,
    parse_npu_smi_info,
)

NPU_SMI_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 300.0
PACKAGES = ("torch", "torch_npu", "torchtitan")
NET_DIR = "/sys/class/net"
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
    device_count: int | None = None
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    interfaces: list[str] | None = None
    ephemeral_range: tuple[int, int] | None = None
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.node_rank} ({self.hostname})"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeFacts:
        smi = data.get("npu_smi")
        ephemeral = data.get("ephemeral_range")
        return cls(**{**data,
                      "npu_smi": None if smi is None else NpuSmiInfo(
                          smi["tool_version"], smi["driver_version"], tuple(Chip(**chip) for chip in smi["chips"])),
                      "ephemeral_range": None if ephemeral is None else tuple(ephemeral)})


class FactError(RuntimeError):
    """A fact could not be collected; the message says what was found instead."""


def run_tool(argv: list[str], timeout_s: float, name: str | None = None) -> str:
    """stdout of a command; FactError naming a missing tool, a timeout or a failure (with its last stderr line).
    `name` stands for the command in messages (default: the command line)."""
    if shutil.which(argv[0]) is None:
        raise FactError(f"{argv[0]} not on PATH")
    name = name or f"`{' '.join(argv)}`"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise FactError(f"{name} timed out after {timeout_s:.0f} s") from None
    if done.returncode != 0:
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


def cann_version(ascend_home: str, env: dict[str, str]) -> str:
    """The `version=` of CANN's `<toolkit home>/<arch>-linux/ascend_toolkit_install.info`, the toolkit home being
    $ASCEND_HOME_PATH once set_env.sh ran, else <ascend_home>/ascend-toolkit/latest (<= 8.3) or
    <ascend_home>/cann (8.5+)."""
    info = Path(f"{platform.machine()}-linux") / "ascend_toolkit_install.info"
    homes = [home for home in (env.get("ASCEND_HOME_PATH"), f"{ascend_home}/ascend-toolkit/latest",
                               f"{ascend_home}/cann") if home]
    for path in (Path(home) / info for home in homes):
        if path.is_file():
            version = parse_key_values(path.read_text(encoding="utf-8", errors="replace")).get("version")
            if version:
                return version
            raise FactError(f"{path} has no version= line")
    raise FactError(f"no {info} under {', '.join(homes)}")


def probe_device_count() -> int:
    """torch.npu.device_count() as the ranks will see it (same Python, same environment), in a child process."""
    out = run_tool([sys.executable, "-m", "slurm_titan.doctor.probe"], PROBE_TIMEOUT_S, "the torch_npu probe")
    try:
        return int(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise FactError(f"the torch_npu probe printed {out.strip()[-200:]!r}") from None


def _collect(facts: NodeFacts, check: str, collect: Callable[[], T]) -> T | None:
    """collect() or None, recording why under problems[check]."""
    try:
        return collect()
    except (FactError, OSError, ValueError) as error:
        facts.problems[check] = str(error)
        return None


def _npu_smi_info() -> NpuSmiInfo:
    return parse_npu_smi_info(run_tool(["npu-smi", "info"], NPU_SMI_TIMEOUT_S))


def _board(npu_id: int) -> dict[str, str]:
    return parse_colon_fields(run_tool(["npu-smi", "info", "-t", "board", "-i", str(npu_id)], NPU_SMI_TIMEOUT_S))


def _collect_npu(facts: NodeFacts, expect: DoctorExpectations) -> None:
    facts.npu_smi = _collect(facts, "npu-smi", _npu_smi_info)
    for npu_id in dict.fromkeys(chip.npu_id for chip in facts.npu_smi.chips) if facts.npu_smi else ():
        board = _collect(facts, "firmware", partial(_board, npu_id))
        if board is not None and board.get("Firmware Version"):
            facts.firmware[str(npu_id)] = board["Firmware Version"]
    facts.cann_version = _collect(facts, "CANN", partial(cann_version, expect.ascend_home, dict(os.environ)))
    facts.device_count = _collect(facts, "device count", probe_device_count)


def collect_facts(expect: DoctorExpectations, node_rank: int) -> NodeFacts:
    """This node's facts: versions, and what `expect` asks about: checkpoint disk, network interfaces, the
    ephemeral port range; with device npu also npu-smi, firmware, CANN and torch_npu's device count."""
    facts = NodeFacts(node_rank, socket.gethostname(), expect.device, package_versions())
    if expect.checkpoint_dir is not None:
        place = _collect(facts, "disk", partial(free_space, expect.checkpoint_dir))
        if place is not None:
            facts.disk_path, facts.disk_free_bytes = place
    if expect.socket_ifnames:
        facts.interfaces = _collect(facts, "network interface", lambda: sorted(os.listdir(NET_DIR)))
    if expect.hccl_port_ranges:
        facts.ephemeral_range = _collect(facts, "HCCL ports", rendezvous.read_ephemeral_range)
    if expect.device == "npu":
        _collect_npu(facts, expect)
    return facts
