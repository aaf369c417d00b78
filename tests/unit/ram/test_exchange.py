"""The nodes' RAM holdings through the attempt's folder: node 0 collects, the others read one file
(slurm_titan.ram.exchange)."""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_titan.ram import exchange
from slurm_titan.ram.choice import Holding
from slurm_titan.ram.exchange import HoldingsExchange, MemoryUnavailable
from slurm_titan.records.held_folder import HeldFolder

NODES = 4


def _holding(node: int) -> Holding:
    return Holding(node, f"n{node}", 5000 + node, f"token-{node}", {8: [2 * node, 2 * node + 1], 6: [2 * node]})


def _gather_all(folder: Path, publishing: Collection[int], timeout_s: float = 30) -> list[list[Holding] | str]:
    """Every node's gather at once (a thread each, a held folder each, as the supervisors); the nodes of
    `publishing` publish first. A node's MemoryUnavailable is its line."""

    def node(k: int) -> list[Holding] | str:
        with HeldFolder(folder) as held:
            side = HoldingsExchange(held, k, NODES, timeout_s=timeout_s, poll_s=0.01)
            if k in publishing:
                side.publish(_holding(k))
            try:
                return side.gather()
            except MemoryUnavailable as error:
                return str(error)

    with ThreadPoolExecutor(NODES) as pool:
        return list(pool.map(node, range(NODES)))


def test_every_node_gets_every_holding_from_the_one_collected_file(tmp_path: Path) -> None:
    gathered = _gather_all(tmp_path / "ram", range(NODES))
    assert gathered == [[_holding(k) for k in range(NODES)]] * NODES
    assert sorted(p.name for p in (tmp_path / "ram").iterdir()) == [exchange.COLLECTED] + [
        f"node-{k}.json" for k in range(NODES)]


def test_a_node_that_published_nothing_sends_every_node_to_the_store_with_one_line(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    monkeypatch.setattr(exchange, "COLLECT_S", 5.0)
    gathered = _gather_all(tmp_path / "ram", range(NODES - 1), timeout_s=0.3)
    assert gathered == ["node(s) [3] said nothing of their memory within 0 s"] * NODES


def test_an_unreadable_holding_is_named_on_every_node(tmp_path: Path) -> None:
    (tmp_path / "ram").mkdir()
    (tmp_path / "ram" / "node-2.json").write_text('{"node": 2}')  # written by something else
    gathered = _gather_all(tmp_path / "ram", (0, 1, 3))
    assert len(set(map(str, gathered))) == 1
    assert f"{tmp_path / 'ram'}/node-2.json: not a RAM holding ('host')" in str(gathered[0])


def test_without_the_collector_the_others_give_up_after_its_time(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(exchange, "COLLECT_S", 0.2)
    with HeldFolder(tmp_path / "ram") as held:
        side = HoldingsExchange(held, 1, NODES, timeout_s=0.1, poll_s=0.01)
        side.publish(_holding(1))
        with pytest.raises(MemoryUnavailable, match=r"node 0 collected no holdings within 0 s"):
            side.gather()


def test_a_node_looks_for_the_collected_file_only_after_a_wait(tmp_path: Path, monkeypatch) -> None:
    with HeldFolder(tmp_path / "ram") as held:
        HoldingsExchange(held, 0, 1).publish(_holding(0))
        held.replace_text(exchange.COLLECTED, '{"holdings": []}')  # there already: still not listed at once
        listings: list[float] = []
        names = held.names
        monkeypatch.setattr(held, "names", lambda: listings.append(time.monotonic()) or names())
        started = time.monotonic()
        assert HoldingsExchange(held, 1, NODES, poll_s=0.2).gather() == []
    assert len(listings) == 1 and listings[0] - started >= 0.1  # every node publishes as this one just did
