"""Pure parsers of what the doctor reads on a node: `npu-smi info`, `npu-smi info -t board`, CANN's install info.

`npu-smi info` prints two table rows per chip (npu-smi's printf layouts; tests/data/npu-smi/ holds recordings):

- Atlas A2 (910B):  `| NPU Name | Health | Power(W) Temp(C) Hugepages |` then `| Chip | Bus-Id | AICore(%) Memory HBM |`
- Atlas A3 (910_93): the same, two chips per NPU, the second row `| Chip Phy-ID | ...`, die 1's power `-`
- Ascend 950: `| NPU ID | Name | Health | Power(W) Temp(C) Hugepages |` then `| | | Bus-Id | NPU Util(%) Memory HBM |`

The header `| npu-smi <tool> Version: <driver> |` carries the driver (software) version. Health is one of
OK, Warning (minor alarm), Alarm (major), Critical, UNKNOWN (device absent or not started). A process table
follows the chips: `| NPU Chip | Process id | Process name | Process memory(MB) |`, one row per process holding
a chip (`| 6  0 | 731204 | python3 | 54682 |`), or `No running processes found in NPU N`; npu-smi in a
container shows only the processes it can see.
`npu-smi info -t board -i N` prints `Key : Value` lines, among them `Software Version` and `Firmware Version`.
CANN's `ascend_toolkit_install.info` is `key=value` lines, among them `version=8.1.RC1`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEALTH_STATES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
_HEALTH = re.compile(rf"^({'|'.join(HEALTH_STATES)})$", re.IGNORECASE)
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]+|NA)$")
_HEADER = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")
_FRACTION = re.compile(r"(\d+)\s*/\s*(\d+)")
BUSY_HBM_FRACTION = 0.5


@dataclass(frozen=True)
class Chip:
    """One chip (a logical device) as `npu-smi info` shows it."""

    npu_id: int
    chip_id: int
    name: str
    health: str
    power_w: float | None
    temp_c: int | None
    hbm_used_mb: int | None
    hbm_total_mb: int | None
    bus_id: str
    phy_id: int | None = None


    @property
    def busy(self) -> bool:
        """More than BUSY_HBM_FRACTION of its HBM in use: another process (or a killed one not yet freed) holds it."""
        used, total = self.hbm_used_mb, self.hbm_total_mb
        return used is not None and total is not None and total > 0 and used > BUSY_HBM_FRACTION * total


@dataclass(frozen=True)
class ChipProcess:
    """One row of `npu-smi info`'s process table: a process holding a chip's memory."""

    npu_id: int
    chip_id: int
    pid: int
    name: str
    memory_mb: int | None


@dataclass(frozen=True)
class NpuSmiInfo:
    """`npu-smi info`: the driver version from its header, every chip in listing (logical id) order, and the
    processes it shows holding them."""

    tool_version: str | None
    driver_version: str | None
    chips: tuple[Chip, ...]
    processes: tuple[ChipProcess, ...] = ()

    def judged(self, visible: tuple[int, ...]) -> list[Chip]:
        """The chips of the logical devices `visible` (empty: every chip) that exist."""
        return [self.chips[i] for i in visible or range(len(self.chips)) if i < len(self.chips)]

    def holders(self, chip: Chip) -> list[ChipProcess]:
        return [p for p in self.processes if (p.npu_id, p.chip_id) == (chip.npu_id, chip.chip_id)]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_npu_smi_info(text: str) -> NpuSmiInfo:
    """Parse `npu-smi info`; ValueError if a chip row is malformed or no chip is listed."""
    header = _HEADER.search(text)
    chips: list[Chip] = []
    first: tuple[int, str, str, float | None, int | None] | None = None
    lines = text.splitlines()
    table = next((i for i, line in enumerate(lines) if "Process id" in line), len(lines))
    for line in lines[:table]:
        if not line.lstrip().startswith("|"):
            continue
        cells = _cells(line)
        health_at = next((i for i, cell in enumerate(cells) if _HEALTH.match(cell)), None)
        bus_at = next((i for i, cell in enumerate(cells) if _BUS_ID.match(cell)), None)
        if health_at is not None:
            ident = " ".join(cells[:health_at]).split()
            metrics = " ".join(cells[health_at + 1:]).split()
            if len(ident) < 2 or not ident[0].isdigit() or len(metrics) < 2:
                raise ValueError(f"unexpected npu-smi chip row: {line.strip()}")
            temp = _number(metrics[1])
            first = (int(ident[0]), " ".join(ident[1:]), cells[health_at], _number(metrics[0]),
                     None if temp is None else int(temp))
        elif bus_at is not None and first is not None:
            ids = [int(token) for token in " ".join(cells[:bus_at]).split() if token.isdigit()]
            fractions = _FRACTION.findall(" ".join(cells[bus_at + 1:]))
            hbm = fractions[-1] if len(fractions) >= 2 else (None, None)
            npu_id, name, health, power, temp = first
            chips.append(Chip(npu_id, ids[0] if ids else 0, name, health, power, temp,
                              None if hbm[0] is None else int(hbm[0]), None if hbm[1] is None else int(hbm[1]),
                              cells[bus_at], ids[1] if len(ids) > 1 else None))
            first = None
    if not chips:
        raise ValueError("npu-smi info listed no chips")
    return NpuSmiInfo(header.group(1) if header else None, header.group(2) if header else None, tuple(chips),
                      _processes(lines[table + 1:]))


def _processes(lines: list[str]) -> tuple[ChipProcess, ...]:
    """The rows of npu-smi's process table: `| <npu> <chip> | <pid> | <name> | <memory MB> |`."""
    processes = []
    for line in lines:
        cells = _cells(line) if line.lstrip().startswith("|") else []
        ids = cells[0].split() if cells else []
        if len(cells) >= 4 and len(ids) == 2 and all(i.isdigit() for i in ids) and cells[1].isdigit():
            memory = _number(cells[3])
            processes.append(ChipProcess(int(ids[0]), int(ids[1]), int(cells[1]), cells[2],
                                         None if memory is None else int(memory)))
    return tuple(processes)


def parse_colon_fields(text: str) -> dict[str, str]:
    """`Key : Value` lines (npu-smi info -t ...) as a mapping; the first occurrence of a key wins."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields


def parse_key_values(text: str) -> dict[str, str]:
    """`key=value` lines (CANN's *_install.info, driver version.info)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields
