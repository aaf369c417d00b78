"""Which node an attempt's failure belongs to, and whether that node is left out (runs in the batch shell).

Every node supervisor reports its ranks' exit codes and the first failure it saw, with the time
(`attempts/<A>/node-<N>.json`), or the hang its watchdog saw. A node without a report that does not
answer (Slurm calls it down, or a probe step cannot run on it) was lost, and comes first: its peers'
ranks fail or hang because it vanished. Else the attempt's failure is the earliest crash: the rank
that died first, not the peers that died after it in a collective. Which came first is not left to the
nodes' clocks alone (one node's clock seconds off would decide): a crash whose rank log shows only a peer's or
the network's symptom (failure_kinds.NETWORK: a connection reset or closed by the peer, HCCL's heartbeat lost)
comes after every crash that shows something else (`symptom_nodes`); the time orders crashes alike in that. The
times are compared on one clock, the batch shell's: a node's are moved onto it by when the step watcher first saw
its report (`on_one_clock`: the report says when the node first wrote it, so the moves are durations on the node's
own clock); the nodes' own clocks only when a report was not sighted (the watcher died, or the report was there
before it first looked). A crash seen before any node's
watchdog fired beats the hangs (a peer waiting on a dead rank also hangs); otherwise the hang of the
rank that stopped making progress first is blamed (node.culprit.culprit_key: a rank that does not run
at all, then one that does not wait in a collective, then the one least far in steps and phases, then the
earliest `since`); the crashes after it
are the kill's consequences. A crash whose log shows a peer's fault (failure_kinds.PEER) counts against the
peer's node when the log names it, and against no node when it does not. A preflight failure after a restart
whose failures may clear by themselves (a chip a killed rank still held) is blamed on the lowest node rank that
failed it (`preflight_failure`). Pure functions over those reports, unit-tested on recorded ones.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from slurm_titan import failure_kinds
from slurm_titan.doctor import TRANSIENT_CHECKS, Finding, failures, node_rank
from slurm_titan.node.culprit import culprit_key
from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder, read_each

LOST = "lost"
CRASHED = "crashed"
HUNG = "hung"
PREFLIGHT = "preflight"


@dataclass(frozen=True)
class NodeFailure:
    """The first failure of an attempt: a rank that crashed or hung on `host`, `host` lost whole, or its
    preflight failed."""

    host: str
    kind: str  # CRASHED | HUNG | LOST | PREFLIGHT
    rank: int | None = None
    exit_code: int | None = None
    step: int | None = None  # HUNG: the step it was in, and the phase
    phase: str | None = None
    fault: str | None = None  # the failure kind its rank log shows (failure_kinds), once classified
    evidence: str | None = None  # the log line that shows it
    peer: str | None = None  # a peer's fault: the attempt's node whose device the log names, when it names one
    also_lost: tuple[str, ...] = ()  # LOST: the attempt's other nodes lost with `host` (a node and its partner)

    def describe(self) -> str:
        if self.kind == LOST:
            if self.also_lost:
                return f"nodes {', '.join((self.host, *self.also_lost))} lost"
            return f"node {self.host} lost"
        if self.kind == HUNG:
            return f"hung on {self.host} rank {self.rank} at step {self.step} ({self.phase})"
        if self.kind == PREFLIGHT:
            return f"preflight failed on {self.host} ({self.evidence})"
        shown = f" ({self.fault}: {self.evidence!r})" if self.evidence else ""
        blamed = f", the faulty memory on peer node {self.peer}" if self.peer else ""
        return f"crashed on {self.host} rank {self.rank} with {exit_description(self.exit_code)}{shown}{blamed}"

    def blamed(self) -> tuple[str, str]:
        """The node this failure counts against and its kind there: a peer's fault that names the peer is the
        peer node's hardware fault; any other failure is this node's, of the kind its log shows (a peer's
        fault naming no peer: `peer`, which says nothing about this node)."""
        if self.fault == failure_kinds.PEER and self.peer:
            return self.peer, failure_kinds.HARDWARE
        return self.host, self.fault or failure_kinds.UNKNOWN


def exit_description(code: int | None) -> str:
    """`SIGKILL` for a process killed by a signal (Popen's negative codes, or 128+N), else `exit code N`."""
    if code is None:
        return "no exit code"
    number = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else None
    if number is not None:
        try:
            return signal.Signals(number).name
        except ValueError:
            pass
    return f"exit code {code}"


def read_reports(job_dir: Path, attempt: int, nodes: int) -> dict[int, dict]:
    """The node reports of an attempt that exist and parse, by node rank: one listing, then each report read by its
    name through the attempt's folder held open, 16 at once (`read_each`; a read by path walked the whole path: at 64
    nodes on a shared file system with 20 ms lookups, the batch shell spent 29 s reading them before deciding)."""
    try:
        with HeldFolder(run_folder.attempt_folder(job_dir, attempt)) as folder:
            wanted = sorted(node for node in run_folder.node_numbers(folder.names(), ".json") if node < nodes)
            texts = read_each(lambda node: _read_report(folder, node), wanted)
    except OSError:  # the folder cannot be listed: no node reported (the attempt failed)
        return {}
    return {node: report for node, report in zip(wanted, texts, strict=True) if report is not None}


def _read_report(folder: HeldFolder, node: int) -> dict | None:
    try:
        report = json.loads(folder.read_text(run_folder.node_report_name(node)))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def silent_nodes(reported: Collection[int], hosts: list[str]) -> list[str]:
    """The attempt's nodes that wrote no report (lost, or killed hard by srun after another node failed):
    `reported`, the nodes that did (the reports by node, or only their numbers)."""
    return [host for node, host in enumerate(hosts) if node not in reported]


def symptom_nodes(reports: dict[int, dict], job_dir: Path) -> set[int]:
    """The nodes whose first crashed rank's log shows a peer's or the network's symptom (failure_kinds.NETWORK):
    they died because another rank did, not first (one rank log's tail read a crashed node)."""
    crashed = [(node, int(failure["rank"])) for node, report in reports.items()
               if (failure := report.get("first_failure"))]
    kinds = read_each(lambda crash: failure_kinds.classify_log(run_folder.rank_log(job_dir, crash[1])).kind, crashed)
    return {node for (node, _), kind in zip(crashed, kinds, strict=True) if kind == failure_kinds.NETWORK}


def read_sightings(job_dir: Path, attempt: int) -> dict[int, float]:
    """When the batch shell's step watcher first saw each node's report, on its clock ({} without a record)."""
    try:
        return {int(node): float(at) for node, at in
                json.loads(run_folder.report_sightings(job_dir, attempt).read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def on_one_clock(reports: dict[int, dict], sightings: dict[int, float]) -> dict[int, float]:
    """What to add to each node's times to put them on the batch shell's clock: its report's sighting (the
    watcher's clock) minus the report's first write (the node's), so that an event `first_written - t` before that
    write, a duration on one clock, happened `sighting - (first_written - t)`: a node's clock seconds off then
    decides nothing (the sightings' resolution: the watcher's listing, step_watch.SIGHT_POLL_S). Nothing is added
    (0 for every node: the nodes' own clocks) unless every report has both."""
    try:
        return {node: sightings[node] - float(report["first_written"]) for node, report in reports.items()}
    except (KeyError, TypeError, ValueError):
        return dict.fromkeys(reports, 0.0)


def _shifted(hang: dict, by: float) -> dict:
    return hang | {"since": float(hang["since"]) + by, "time": float(hang["time"]) + by}


def first_failure(reports: dict[int, dict], hosts: list[str], lost: set[str],
                  symptoms: set[int] | frozenset[int] = frozenset(),
                  sightings: dict[int, float] | None = None) -> NodeFailure | None:
    """The nodes of the attempt that were lost (`lost`: silent and not answering), else the earliest rank
    failure any node saw (a crash before any hang was seen, else the stuck rank's hang); a crash of one of the
    `symptoms` nodes (:func:`symptom_nodes`) after those of every other node, whatever their clocks say. The times
    are compared on the batch shell's clock when every report was sighted (:func:`on_one_clock`), else on the
    nodes' own."""
    if gone := [host for host in silent_nodes(reports, hosts) if host in lost]:
        return NodeFailure(gone[0], LOST, also_lost=tuple(gone[1:]))
    shift = on_one_clock(reports, sightings or {})
    hangs = [(node, _shifted(report["hang"], shift[node])) for node, report in reports.items() if report.get("hang")]
    first_hang_seen = min((hang["time"] for _, hang in hangs), default=float("inf"))
    crashes = [(float(report["first_failure"]["time"]) + shift[node], node, report["first_failure"])
               for node, report in reports.items() if report.get("first_failure")]
    seen = [crash for crash in crashes if crash[0] < first_hang_seen]
    if hangs and not seen:
        node, hang = min(hangs, key=lambda item: culprit_key(item[1]))
        return NodeFailure(reports[node].get("host") or hosts[node], HUNG, int(hang["rank"]),
                           step=int(hang["step"]), phase=str(hang["phase"]))
    if seen:
        _, node, failure = min(seen, key=lambda item: (item[1] in symptoms, item[0]))
        return NodeFailure(reports[node].get("host") or hosts[node], CRASHED, int(failure["rank"]),
                           int(failure["exit_code"]))
    return None


def preflight_failure(verdict: list[Finding] | None, hosts: list[str], attempt: int) -> NodeFailure | None:
    """The node to blame for a preflight failure that a restart may clear, or None when it ends the run.

    Retried only after a restart (`attempt` > 0: a rank killed at the end of the attempt before may still
    hold its chip's memory), and only when node 0's `verdict` holds nothing but failures of TRANSIENT_CHECKS on
    nodes of this attempt: a lasting failure (versions, health, ports, a silent node) fails again on retry. The
    lowest node rank that failed is blamed; `exclusion_reason` leaves it out when it fails again.
    """
    failed = failures(verdict or [])
    ranks = [node_rank(finding) for finding in failed]
    if attempt == 0 or not failed or any(f.check not in TRANSIENT_CHECKS for f in failed) or \
            not all(rank is not None and rank < len(hosts) for rank in ranks):
        return None
    first = min(rank for rank in ranks if rank is not None)
    evidence = failed[ranks.index(first)]
    return NodeFailure(hosts[first], PREFLIGHT, fault=failure_kinds.UNKNOWN,
                       evidence=f"{evidence.check}: {evidence.found}")


def host_addresses(host: str) -> set[str]:
    """The addresses `host` resolves to here (none when it does not resolve)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


def peer_host(address: str, hosts: list[str], resolve: Callable[[str], set[str]]) -> str | None:
    """The host of `hosts` that `address` (a name or an IP address from a log) is, or None."""
    if address in hosts:
        return address
    return next((host for host in hosts if address in resolve(host)), None)


def classified(failure: NodeFailure, job_dir: Path, hosts: list[str],
               resolve: Callable[[str], set[str]] = host_addresses) -> NodeFailure:
    """`failure` with the kind its rank's log shows (`failure_kinds`) and, for a peer's fault, the node of the
    attempt's `hosts` that the log names as the peer; a lost node has no log: unknown."""
    if failure.kind == LOST or failure.rank is None:
        return dataclasses.replace(failure, fault=failure_kinds.UNKNOWN)
    verdict = failure_kinds.classify_logs([run_folder.rank_log(job_dir, failure.rank)])
    return dataclasses.replace(failure, fault=verdict.kind, evidence=verdict.line,
                               peer=peer_host(verdict.peer, hosts, resolve) if verdict.peer else None)


def exclusion_reason(failure: NodeFailure, spare_left: bool, earlier_culprits: list[str]) -> str | None:
    """Why the node `failure.blamed()` names is left out for the rest of the run, or None to keep it.

    A lost node is left out, and so is one whose rank log shows a hardware fault (HBM ECC, UCE: retrying on
    it only fails again), and the peer node a peer's fault names (its device memory failed); a peer's fault
    that names no peer leaves nothing out. A node among `earlier_culprits` (blamed before in this run, and the
    attempt failed again without progress: `finish.leave_out`) is left out: a node that fails every time costs one
    retry, not the whole retry budget. One whose failures came with training between them is kept where no spare
    waits: leaving it out would requeue the job (a wait in the queue, the RAM tier's snapshots lost) for what may be
    chance. With a healthy spare waiting, a node is left out on its first failure: swapping costs nothing, and a
    suspect node may fail again; not on a fault CANN says to retry (a link error).
    """
    if failure.kind == LOST:
        return "lost"
    if failure.fault == failure_kinds.PEER:
        return f"hardware fault seen by a peer ({failure.describe()})" if failure.peer else None
    if failure.fault == failure_kinds.HARDWARE:
        return f"hardware fault ({failure.describe()})"
    if failure.host in earlier_culprits:
        return f"failed again ({failure.describe()})"
    if spare_left and failure.fault != failure_kinds.RETRY:
        return f"suspect, swapped for a spare ({failure.describe()})"
    return None
