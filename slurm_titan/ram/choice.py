"""Which RAM snapshot a recovery takes: the newest step of which every rank has a complete copy on some node.

Every node of the new attempt says what it holds (:class:`Holding`); every node works out the same
:class:`Choice` from the same holdings, so the supervisors agree on the step without another round. A rank's copy
is taken from the node that will run it when that node holds one (no transfer), else from the lowest-numbered node
that does.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Holding:
    """What node ``node`` of the attempt holds in memory ({step: ranks}), where its snapshot server listens and the
    token it asks for."""

    node: int
    host: str
    port: int
    token: str
    held: dict[int, list[int]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str, where: str) -> Holding:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{where}: not a RAM holding ({e})") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Holding:
        """The holding of :meth:`to_json`'s fields (read back from JSON: the steps are strings)."""
        try:
            return cls(node=int(data["node"]), host=str(data["host"]), port=int(data["port"]), token=str(data["token"]),
                       held={int(s): [int(r) for r in ranks] for s, ranks in data["held"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{where}: not a RAM holding ({e})") from None


@dataclass(frozen=True)
class Choice:
    """The step to restore and, for each rank, the node its copy comes from."""

    step: int
    source: dict[int, int]

    def moved(self, node_of: dict[int, int]) -> dict[int, int]:
        """{rank: source node} of the copies that must cross the network (``node_of``: each rank's node now)."""
        return {rank: node for rank, node in self.source.items() if node != node_of[rank]}


def choose(holdings: list[Holding], world_size: int, node_of: dict[int, int]) -> Choice | None:
    """The newest step every one of ``world_size`` ranks has a copy of somewhere, None when there is none.
    ``node_of``: the node each rank runs on in the new attempt (preferred as the source of its copy)."""
    by_step: dict[int, dict[int, list[int]]] = {}
    for holding in holdings:
        for step, ranks in holding.held.items():
            for rank in ranks:
                by_step.setdefault(step, {}).setdefault(rank, []).append(holding.node)
    for step in sorted(by_step, reverse=True):
        holders = by_step[step]
        if all(rank in holders for rank in range(world_size)):
            return Choice(step, {rank: (node_of[rank] if node_of[rank] in holders[rank] else min(holders[rank]))
                                 for rank in range(world_size)})
    return None


def missing(holdings: list[Holding], world_size: int, step: int) -> list[int]:
    """The ranks of ``world_size`` of which no node of ``holdings`` holds a copy of ``step``."""
    held = {rank for holding in holdings for rank in holding.held.get(step, [])}
    return [rank for rank in range(world_size) if rank not in held]
