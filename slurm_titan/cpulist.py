"""CPU lists as `taskset -c` and /sys/devices/system/cpu/online write them ("0-3,8")."""

from __future__ import annotations


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPU numbers of a list such as ``"1"``, ``"0-3,8"`` or ``"48-63,112-127"`` (the format of
    ``taskset -c`` and /sys/devices/system/cpu/online). ValueError (one line) if it is not one."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list (e.g. '1' or '0-3,8')")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"{part!r} in {text!r}: the range runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    """The shortest CPU list for `cpus` (inverse of :func:`parse_cpu_list`)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
