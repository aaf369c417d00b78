"""What kind of failure a rank's log shows: bad hardware here or on a peer, a fault to retry, the network, the
user's code, memory, or unknown.

Pure functions over the tail of `<job>/logs/rank-R.log` (a bounded number of bytes: logs can be
huge). Each signature is a line pattern with its kind; the most telling kind found wins, in this
order, and its last matching line is the evidence. The CANN runtime codes (rt_error_codes.h) are read as
CANN's error table says:

- hardware: the node's own devices are bad. torch_npu's device errors (`UCE ERROR`, `HBM MULTI BIT
  ECC ERROR`, its `deviceErrorMap` in NPUQueue.cpp) and the codes 507010 ts lost heartbeat, 507053 device
  MEM ERROR, 507054 hbm Multi-bit ECC error, 507901 hdc disconnect;
- peer: 507055 suspect device MEM ERROR (torch_npu's `SUSPECT MEM ERROR`): "由于当前Device访问的对端Device内存发生故障，
  用户需排查对端Device进程", the memory that failed is the *peer* device's, which the log names only in HCCL's
  cluster exception report (`Cluster Exception Location[IP/ID]:[<address>/<device>]`, Verdict.peer);
- oom: device or host memory ran out (torch_npu's `NPU out of memory`, the kernel's OOM killer,
  slurmstepd's oom_kill report): the job's size, not the node;
- retry: 507056 link ERROR (torch_npu's `HCCS LINK ERROR`), for which CANN's table says "建议重试" (retry):
  no proof of a bad node;
- network: a peer's or the fabric's symptom, not proof of a bad local device: 507057 suspect remote
  ERROR, 507904 hccl operation retry failed, HCCL EI0006 ("Remote Rank did not send the data in
  time") and EI0002 (notify wait timeout), HCCL's `Heartbeat Lost Occurred` (a remote process exited
  or the network broke), RoCE `error cqe`, gloo/NCCL connection resets;
- unknown: any other CANN runtime error (507xxx), e.g. 507035 vector core exception, which CANN's
  own cases trace to kernel bugs as often as to hardware;
- user: a Python exception (the training code or its config).

One more kind is never read from a log: `slow`, a node the batch shell judged slow against the others
(node.batch.straggler). It is no failure of the run, only of the node's speed, recorded in the node ledger so
that the next job avoids the node.

The recorded lines behind each signature are in tests/data/failure_logs/ (README names sources).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

HARDWARE = "hardware"
PEER = "peer"
RETRY = "retry"
NETWORK = "network"
USER = "user"
OOM = "oom"
UNKNOWN = "unknown"
SLOW = "slow"

TAIL_BYTES = 64 * 1024
EVIDENCE_CHARS = 200

_ERROR_CODE = r"error code(?: is|:)\s*"
# (kind, pattern), most telling kind first: the first kind with a match in the tail wins.
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (HARDWARE, re.compile(r"UCE\s+ERROR|HBM MULTI BIT ECC ERROR")),
    (HARDWARE, re.compile(_ERROR_CODE + r"5070(?:10|53|54)\b|" + _ERROR_CODE + r"507901\b")),
    (PEER, re.compile(r"SUSPECT MEM ERROR|" + _ERROR_CODE + r"507055\b")),
    (OOM, re.compile(r"(?:NPU|CUDA) out of memory|OutOfMemoryError|Out of memory: Killed process"
                     r"|oom[-_]kill event|task \d+: Out Of Memory")),
    (RETRY, re.compile(r"HCCS LINK ERROR|" + _ERROR_CODE + r"507056\b")),
    (NETWORK, re.compile(r"SUSPECT REMOTE ERROR|HCCL OP RETRY FAILED|" + _ERROR_CODE + r"(?:507057|507904)\b")),
    (NETWORK, re.compile(r"\bEI000[26]\b|Heartbeat Lost Occurred|error cqe|wait socket establish timeout"
                         r"|Connection (?:closed|reset) by peer|NCCL WARN NET/", re.IGNORECASE)),
    (UNKNOWN, re.compile(_ERROR_CODE + r"507\d{3}\b")),
    (USER, re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::|$)")),
)
_RANK = {kind: order for order, kind in enumerate((HARDWARE, PEER, OOM, RETRY, NETWORK, UNKNOWN, USER))}
_PEER_ADDRESS = re.compile(r"Cluster Exception Location\[IP/ID\]:\[([^/\]\s]+)/")


class Verdict(NamedTuple):
    """A failure's kind and the log line that shows it (None when no signature matched); for a peer's fault,
    the address of the peer HCCL's report names (None when none)."""

    kind: str
    line: str | None
    peer: str | None = None


NO_EVIDENCE = Verdict(UNKNOWN, None)


def read_tail(path: Path, limit: int = TAIL_BYTES) -> list[str]:
    """The last lines of `path` within `limit` bytes (a cut first line dropped); [] if unreadable."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            start = max(0, size - limit)
            log.seek(start)
            data = log.read(limit)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if start > 0 else lines


def classify_lines(lines: Iterable[str]) -> Verdict:
    """The most telling kind any line shows, with the last such line (from the matched text on) and, for a
    peer's fault, the peer's address (`_peer_address`)."""
    lines = list(lines)
    best: tuple[int, int, str] | None = None  # (signature index, -line number, evidence)
    for number, line in enumerate(lines):
        text = line.strip()
        for index, (_, pattern) in enumerate(SIGNATURES):
            if best is not None and index > best[0]:
                break
            if match := pattern.search(text):
                candidate = (index, -number, text[match.start():][:EVIDENCE_CHARS])
                best = candidate if best is None else min(best, candidate)
                break
    if best is None:
        return NO_EVIDENCE
    kind = SIGNATURES[best[0]][0]
    return Verdict(kind, best[2], _peer_address(lines) if kind == PEER else None)


def _peer_address(lines: list[str]) -> str | None:
    """The address of the abnormal device HCCL's last cluster exception report in `lines` names, or None."""
    found = [match[1] for line in lines if (match := _PEER_ADDRESS.search(line))]
    return found[-1] if found else None


def classify_log(path: Path, limit: int = TAIL_BYTES) -> Verdict:
    """The kind of failure the tail of one log shows."""
    return classify_lines(read_tail(path, limit))


def classify_logs(paths: Iterable[Path], limit: int = TAIL_BYTES) -> Verdict:
    """The most telling verdict over the given logs (hardware before peer, oom, retry, network, unknown, user)."""
    verdicts = [classify_log(path, limit) for path in paths]
    found = [verdict for verdict in verdicts if verdict.line is not None]
    return min(found, key=lambda verdict: _RANK[verdict.kind]) if found else NO_EVIDENCE
