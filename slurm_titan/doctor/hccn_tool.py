"""Pure parsers of `hccn_tool` (the NPU network tool of Ascend's driver) and what the doctor keeps of it.

Formats as published (tests/data/hccn_tool/ holds the recordings and says where each came from):

- `hccn_tool -i N -ip -g`: `ipaddr:10.10.100.10` and `netmask:255.255.255.0` lines
- `hccn_tool -i N -link -g`: `link status: UP` (or DOWN)
- `hccn_tool -i N -net_health -g`: `net health status: Success`; the states are Success, Socket fail, Receive
  timeout, Unreachable, Time exceeded, Fault, Init (no detect IP set: nothing probed), Thread error, Detect ip
  set (Ascend/mind-cluster faultdiag guide)
- `hccn_tool -i N -tls -g`: among others `dev_id:0, tls switch[0](0:disable, 1:enable), ...`; devices whose TLS
  switches differ cannot link (MindX FAQ "HCCL集群通信失败": the TLS setting must be equal on all nodes)
- `hccn_tool -i N -ping -g address IP`: `recv seq=...` or `recv time out seq=...` lines, then
  `3 packets transmitted, 3 received, 0.00% packet loss`
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_titan.doctor.npu_smi import parse_colon_fields

NET_HEALTH_OK = ("Success", "Init")
"""Healthy: the probe succeeded, or no detect IP is configured so nothing was probed (`Init`)."""
_TLS_SWITCH = re.compile(r"tls switch\[(\d+)\]")
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


@dataclass(frozen=True)
class HccnDevice:
    """One NPU's network port as hccn_tool reports it (None: that query failed or printed nothing usable)."""

    ip: str | None = None
    link: str | None = None
    net_health: str | None = None
    tls_switch: int | None = None


def parse_ip(text: str) -> str | None:
    """The `ipaddr` of `-ip -g`; None if the device has no address."""
    return parse_colon_fields(text).get("ipaddr") or None


def parse_link(text: str) -> str | None:
    """`UP` / `DOWN` from `-link -g`."""
    return parse_colon_fields(text).get("link status") or None


def parse_net_health(text: str) -> str | None:
    """The state from `-net_health -g`."""
    return parse_colon_fields(text).get("net health status") or None


def parse_tls_switch(text: str) -> int | None:
    """The TLS switch (0 disabled, 1 enabled) from `-tls -g`."""
    match = _TLS_SWITCH.search(text)
    return None if match is None else int(match.group(1))


def parse_ping(text: str) -> tuple[int, int]:
    """(transmitted, received) from `-ping -g address IP`; ValueError without the summary line."""
    match = _PING_SUMMARY.search(text)
    if match is None:
        raise ValueError(f"no 'packets transmitted' line in hccn_tool's ping output: {text.strip()[-200:]!r}")
    return int(match.group(1)), int(match.group(2))
