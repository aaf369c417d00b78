"""Pure parsers of what the doctor reads on a node: `npu-smi info`, `npu-smi info -t board`, CANN's install info.

`npu-smi info` prints two table rows per chip (npu-smi's printf layouts; tests/data/npu-smi/ holds recordings):

- Atlas A2 (910B):  `| NPU Name | Health | Power(W) Temp(C) Hugepages |` then `| Chip | Bus-Id | AICore(%) Memory HBM |`
- Atlas A3 (910_93): the same, two chips per NPU, the second row `| Chip Phy-ID | ...`, die 1's power `-`
- Ascend 950: `| NPU ID | Name | Health | Power(W) Temp(C) Hugepages |` then `| | | Bus-Id | NPU Util(%) Memory HBM |`

The header `| npu-smi <tool> Version: <driver> |` carries the driver (software) version. Health is one of
OK, Warning (minor alarm), Alarm (major), Critical, UNKNOWN (device absent or not started).
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


@dataclass(frozen=True)
class NpuSmiInfo:
    """`npu-smi info`: the driver version from its header and every chip, in listing (logical id) order."""

    tool_version: str | None
    driver_version: str | None
    chips: tuple[Chip, ...]


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
    for line in text.splitlines():
        if "Process id" in line:  # the process table follows the chips
            break
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
    return NpuSmiInfo(header.group(1) if header else None, header.group(2) if header else None, tuple(chips))


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
