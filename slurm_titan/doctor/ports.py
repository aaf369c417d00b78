"""Pure functions on the kernel's port lists: `net.ipv4.ip_local_reserved_ports` and blocks inside a range.

The reserved-ports list is comma-separated ports and `low-high` ranges, e.g. `60000-60031,8080` (an empty
file: nothing reserved). CANN's HCCL_IF_BASE_PORT page: HCCL uses 60000-60031 by default,
"需要执行如下命令预留" `sysctl -w net.ipv4.ip_local_reserved_ports=60000-60031`: the kernel never picks a
reserved port as an ephemeral one.
"""

from __future__ import annotations

PortRanges = tuple[tuple[int, int], ...]


def parse_port_list(text: str) -> PortRanges:
    """`60000-60031,8080` -> ((60000, 60031), (8080, 8080)); ValueError on anything else."""
    ranges: list[tuple[int, int]] = []
    for item in (part.strip() for part in text.strip().split(",")):
        if not item:
            continue
        low, dash, high = item.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ValueError(f"not a port or low-high range: {item!r}") from None
        if first > last:
            raise ValueError(f"empty port range: {item!r}")
        ranges.append((first, last))
    return tuple(ranges)


def uncovered(low: int, high: int, covering: PortRanges) -> PortRanges:
    """The parts of low-high that no range of `covering` contains, in order."""
    gaps: list[tuple[int, int]] = []
    start = low
    for first, last in sorted(covering):
        if last < start or first > high:
            continue
        if first > start:
            gaps.append((start, first - 1))
        start = max(start, last + 1)
        if start > high:
            break
    if start <= high:
        gaps.append((start, high))
    return tuple(gaps)


def format_ranges(ranges: PortRanges) -> str:
    """The kernel's own notation: `60000-60031,8080`."""
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)
