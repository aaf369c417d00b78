"""The node ledger: every attributed failure on a cluster, shared by its runs, so a new job avoids bad nodes.

One JSON-lines file per cluster, `$SLURM_TITAN_HOME/nodes/<cluster>.jsonl` (the cluster from
SLURM_CLUSTER_NAME inside jobs, else `scontrol show config`'s ClusterName: node names are only
unique within a cluster). The batch shell appends one line per attributed failure: node, time,
job, kind (`slurm_titan.failure_kinds`), cause and whether the run excluded the node. Each
line is one O_APPEND write shorter than PIPE_BUF, so jobs appending at once never interleave.

A node is avoided until `period_s` (default 24 h) after a hardware-kind failure or a judgement of it as slow
(kind `slow`: it slowed every rank of a run, node.batch.straggler), or after the
second of two failures within `window_s` (default 1 h) that say something about it: a bug that
crashes every node says nothing about the node it crashed on first, and neither does a peer's fault
recorded on the node that saw it (`peer`: the log named no peer; a named peer's node is recorded with a
hardware failure, node.batch.attribution.NodeFailure.blamed). Nothing here fails a job: an unwritable ledger and
a corrupt line are one warning each.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_titan import slurm, table
from slurm_titan.errors import ClusterError
from slurm_titan.failure_kinds import HARDWARE, PEER, SLOW, USER
from slurm_titan.records import jobs

PERIOD_S = 24 * 3600.0
WINDOW_S = 3600.0
CAUSE_CHARS = 1000
SAYS_NOTHING = frozenset({USER, PEER})
"""Kinds that say nothing about the node they are recorded on."""
AVOIDED_AT_ONCE = frozenset({HARDWARE, SLOW})
"""Kinds whose first entry keeps new jobs off the node."""


@dataclass(frozen=True)
class Entry:
    """One attributed failure of a node."""

    node: str
    time: float
    job: str
    kind: str
    cause: str
    excluded: bool


@dataclass
class NodeSummary:
    """What the ledger knows of one node: its failures by kind, when last seen failing, until when avoided."""

    node: str
    failures: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    last_seen: float = 0.0
    excluded_until: float | None = None


def warn(message: str) -> None:
    print(f"slurm-titan: WARNING: {message}", file=sys.stderr)


def cluster_name(env: Mapping[str, str] | None = None) -> str:
    """The Slurm cluster's name: SLURM_CLUSTER_NAME (set in jobs), else scontrol's ClusterName.
    Raises ClusterError when neither answers."""
    env = os.environ if env is None else env
    if name := env.get("SLURM_CLUSTER_NAME"):
        return name
    for line in slurm.run(["scontrol", "show", "config"]).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ClusterName" and value.strip():
            return value.strip()
    raise ClusterError("scontrol show config names no ClusterName")


def ledger_path(cluster: str) -> Path:
    return jobs.home() / "nodes" / f"{cluster}.jsonl"


def encode(entry: Entry) -> bytes:
    """One ledger line, its cause cut so that the line stays under PIPE_BUF (one atomic append)."""
    cause = entry.cause[:CAUSE_CHARS]
    while True:
        fields = asdict(entry) | {"cause": cause}
        line = (json.dumps(fields, ensure_ascii=True, sort_keys=True) + "\n").encode()
        if len(line) < select.PIPE_BUF:
            return line
        if not cause:
            raise ValueError(f"ledger line for node {entry.node!r} is {len(line)} bytes, over PIPE_BUF")
        cause = cause[:len(cause) // 2]


def record(path: Path, entry: Entry) -> bool:
    """Append `entry` to the ledger at `path` in one O_APPEND write. An unwritable ledger is one
    warning and False: the run goes on."""
    try:
        line = encode(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
        finally:
            os.close(fd)
        if written != len(line):
            raise OSError(f"short write ({written} of {len(line)} bytes)")
    except (OSError, ValueError) as error:
        warn(f"cannot record node {entry.node}'s failure in {path} ({error}); the run goes on")
        return False
    return True


def read(path: Path) -> list[Entry]:
    """The ledger's entries; a missing ledger is empty, an unreadable one is a warning and empty,
    a corrupt line is a warning naming file and line, and skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as error:
        warn(f"cannot read the node ledger {path} ({error}); no node is avoided")
        return []
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            entries.append(Entry(str(data["node"]), float(data["time"]), str(data["job"]), str(data["kind"]),
                                 str(data["cause"]), bool(data["excluded"])))
        except (ValueError, TypeError, KeyError) as error:
            warn(f"{path}:{number}: not a ledger entry ({error}); skipped")
    return entries


def avoided_until(entries: list[Entry], period_s: float = PERIOD_S, window_s: float = WINDOW_S) -> dict[str, float]:
    """Until when each node is avoided: `period_s` after a hardware failure or a slow verdict, or after the second of
    two failures within `window_s` that say something about it (not SAYS_NOTHING). Nodes never avoided are
    absent."""
    until: dict[str, float] = {}
    previous: dict[str, float] = {}  # a node's last failure that says something about it
    for entry in sorted(entries, key=lambda e: e.time):
        telling = entry.kind not in SAYS_NOTHING
        repeated = telling and entry.time - previous.get(entry.node, float("-inf")) <= window_s
        if entry.kind in AVOIDED_AT_ONCE or repeated:
            until[entry.node] = max(until.get(entry.node, 0.0), entry.time + period_s)
        if telling:
            previous[entry.node] = entry.time
    return until


def avoid(entries: list[Entry], now: float, period_s: float = PERIOD_S, window_s: float = WINDOW_S) -> dict[str, float]:
    """The nodes a new job should keep off at `now`, with until when."""
    return {node: until for node, until in avoided_until(entries, period_s, window_s).items() if until > now}


def keep_off(avoided: dict[str, float], total_nodes: int, wanted: int) -> list[str]:
    """The avoided nodes to pass as `sbatch --exclude`, at most `total_nodes - wanted` of them (those
    avoided longest) so that the job still fits its partition."""
    room = max(0, total_nodes - wanted)
    return sorted(sorted(avoided, key=lambda node: (-avoided[node], node))[:room])


def summary(entries: list[Entry], now: float, period_s: float = PERIOD_S,
            window_s: float = WINDOW_S) -> list[NodeSummary]:
    """One row per node that failed: failures, kinds, last seen, excluded until (None when not now)."""
    rows: dict[str, NodeSummary] = {}
    for entry in entries:
        row = rows.setdefault(entry.node, NodeSummary(entry.node))
        row.failures += 1
        row.kinds[entry.kind] = row.kinds.get(entry.kind, 0) + 1
        row.last_seen = max(row.last_seen, entry.time)
    for node, until in avoid(entries, now, period_s, window_s).items():
        rows[node].excluded_until = until
    return sorted(rows.values(), key=lambda row: (-(row.excluded_until or 0.0), -row.last_seen, row.node))


def record_failure(node: str, job: str, kind: str, cause: str, excluded: bool,
                   env: dict[str, str] | None = None, now: float | None = None) -> bool:
    """The batch shell's hook: append one failure to this cluster's ledger; any trouble is one warning."""
    try:
        path = ledger_path(cluster_name(env))
    except ClusterError as error:
        warn(f"node ledger not written: cluster name unknown ({error})")
        return False
    return record(path, Entry(node, time.time() if now is None else now, job, kind, cause, excluded))


def avoid_now(env: dict[str, str] | None = None, now: float | None = None) -> dict[str, float]:
    """submit's hook: the nodes to keep off a new job on this cluster, with until when ({} when the
    cluster or its ledger cannot be read: one warning)."""
    try:
        path = ledger_path(cluster_name(env))
    except ClusterError as error:
        warn(f"node ledger not read: cluster name unknown ({error})")
        return {}
    return avoid(read(path), time.time() if now is None else now)


def _clock(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "-"


def show(cluster: str | None, as_json: bool = False) -> int:
    """`slurm-titan nodes`: the ledger's summary for `cluster` (default: this one)."""
    name = cluster or cluster_name()
    path = ledger_path(name)
    rows = summary(read(path), time.time())
    if as_json:
        print(json.dumps({"cluster": name, "ledger": str(path), "nodes": [asdict(row) for row in rows]}, indent=1))
        return 0
    if not rows:
        print(f"no node failures recorded on cluster {name} ({path})")
        return 0
    print(table.render(("NODE", "FAILURES", "KINDS", "LAST SEEN", "EXCLUDED UNTIL"), [
        (row.node, str(row.failures), ",".join(f"{kind}:{count}" for kind, count in sorted(row.kinds.items())),
         _clock(row.last_seen), _clock(row.excluded_until)) for row in rows]))
    return 0
