"""Expand Slurm host lists (``n[1-3,7],a-[01-02]``) exactly as ``scontrol show hostnames`` does."""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_ranges(body: str, hostlist: str) -> list[str]:
    """``1-3,07`` -> ["1", "2", "3", "07"], keeping zero padding as Slurm does."""
    values = []
    for item in body.split(","):
        match = _RANGE.match(item)
        if not match:
            raise ValueError(f"bad range {item!r} in host list {hostlist!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"descending range {item!r} in host list {hostlist!r}")
        width = len(first) if first.startswith("0") else 0
        values += [str(number).zfill(width) for number in range(int(first), int(last) + 1)]
    return values


def _expand_host(pattern: str, hostlist: str) -> list[str]:
    """One host pattern, possibly with several bracket groups (``r[1-2]n[1-2]``)."""
    pieces: list[list[str]] = []
    for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", pattern):
        if literal:
            pieces.append([literal])
        if body:
            pieces.append(_expand_ranges(body, hostlist))
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(hostlist: str) -> list[str]:
    """All host names of a Slurm host list, in Slurm's order. Raises ValueError on bad syntax."""
    hosts = [host for pattern in _split_top_level(hostlist.strip()) for host in _expand_host(pattern, hostlist)]
    if not hosts:
        raise ValueError(f"empty host list {hostlist!r}")
    return hosts
