"""The nodes' RAM holdings, exchanged through the attempt's folder on the shared file system: each node writes its own,
node 0 collects them all into one file, which the others read.

Every node's recovery needs every node's holding (the steps it holds, where its snapshot server listens). Read by
every node, that is M^2 reads of the job folder (262,144 at 512 nodes, several metadata operations each, at every
attempt's start); collected, it is 2M: node 0 reads the M holdings (16 at a time: ``held_folder.read_each``) and
writes them whole as ``holdings.json``; the others wait for that name in the folder's listing (polls growing to
``MAX_POLL_S``, spread: :mod:`slurm_titan.records.polls`, the first after a wait: every node publishes at once, and
node 0 has M holdings to read before the file can be there) and read it once.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from slurm_titan.ram.choice import Holding
from slurm_titan.records.held_folder import HeldFolder, read_each
from slurm_titan.records.polls import poll_waits

COLLECTED = "holdings.json"
COLLECTOR = 0
TIMEOUT_S = 300.0
"""How long the collector waits for every node's holding (a node that died before its ranks started sends none)."""
COLLECT_S = 120.0
"""How much longer the other nodes wait for the collected file: the collector's reads and its write."""
POLL_S = 0.2
MAX_POLL_S = 1.0


class MemoryUnavailable(Exception):
    """The RAM tier cannot recover this attempt (a node published nothing, or what it published is unreadable), in one
    line."""


def holding_name(node: int) -> str:
    return f"node-{node}.json"


class HoldingsExchange:
    """Node ``node`` of ``nodes``' side of the exchange, through ``folder`` (the attempt's RAM folder, held open)."""

    def __init__(self, folder: HeldFolder, node: int, nodes: int, timeout_s: float = TIMEOUT_S,
                 poll_s: float = POLL_S) -> None:
        self.folder, self.node, self.nodes, self.timeout_s, self.poll_s = folder, node, nodes, timeout_s, poll_s

    def publish(self, holding: Holding) -> None:
        self.folder.replace_text(holding_name(self.node), holding.to_json())

    def read(self, node: int) -> Holding:
        """Node ``node``'s holding as it published it (ValueError: not a holding; OSError: none)."""
        return Holding.from_json(self.folder.read_text(holding_name(node)), f"{self.folder.path}/{holding_name(node)}")

    def gather(self) -> list[Holding]:
        """Every node's holding, by node. MemoryUnavailable when a node published none within the timeout, or one
        that cannot be read: the same on every node (the collector writes why)."""
        collected = self._collect() if self.node == COLLECTOR else self._wait_for_collected()
        if "why" in collected:
            raise MemoryUnavailable(collected["why"])
        try:
            return [Holding.from_dict(h, f"{self.folder.path}/{COLLECTED}") for h in collected["holdings"]]
        except (KeyError, TypeError, ValueError) as error:
            raise MemoryUnavailable(str(error)) from None

    def _collect(self) -> dict:
        deadline, waits = time.monotonic() + self.timeout_s, poll_waits(self.nodes, self.poll_s, MAX_POLL_S)
        while missing := self._missing():
            if time.monotonic() > deadline:
                return self._write({"why": f"node(s) {missing} said nothing of their memory within "
                                           f"{self.timeout_s:.0f} s"})
            time.sleep(next(waits))
        try:
            holdings = read_each(self.read, list(range(self.nodes)))
        except (OSError, ValueError) as error:
            return self._write({"why": str(error)})
        return self._write({"holdings": [asdict(h) for h in holdings]})

    def _missing(self) -> list[int]:
        names = set(self.folder.names())
        return [k for k in range(self.nodes) if holding_name(k) not in names]

    def _write(self, collected: dict) -> dict:
        self.folder.replace_text(COLLECTED, json.dumps(collected))
        return collected

    def _wait_for_collected(self) -> dict:
        deadline = time.monotonic() + self.timeout_s + COLLECT_S
        waits = poll_waits(self.nodes, self.poll_s, MAX_POLL_S)
        while True:
            time.sleep(next(waits))  # first: every node has just published, node 0 has M holdings to read
            if COLLECTED in self.folder.names():
                break
            if time.monotonic() > deadline:
                return {"why": f"node {COLLECTOR} collected no holdings within {self.timeout_s + COLLECT_S:.0f} s"}
        try:
            collected = json.loads(self.folder.read_text(COLLECTED))
        except (OSError, ValueError) as error:
            return {"why": f"{self.folder.path}/{COLLECTED}: {error}"}
        return collected if isinstance(collected, dict) else {"why": f"{self.folder.path}/{COLLECTED}: not holdings"}
