"""The RAM tier's choice: the newest step every rank can get, each copy from the node that runs its rank when it
holds one."""

from __future__ import annotations

from slurm_titan.ram.choice import Choice, Holding, choose, missing


def holding(node: int, held: dict[int, list[int]]) -> Holding:
    return Holding(node, f"n{node}", 1000 + node, "t", held)


NODE_OF = {0: 0, 1: 0, 2: 1, 3: 1}


def test_the_newest_step_every_rank_has_is_chosen_and_each_copy_comes_from_its_own_node() -> None:
    # node 0: its ranks of 20 and 15, node 1's of 15 (a replica); node 1: its ranks of 15 and 20, node 0's of 15
    holdings = [holding(0, {20: [0, 1], 15: [0, 1, 2, 3]}), holding(1, {20: [2, 3], 15: [0, 1, 2, 3]})]
    assert choose(holdings, 4, NODE_OF) == Choice(20, {0: 0, 1: 0, 2: 1, 3: 1})


def test_a_lost_nodes_ranks_come_from_the_partner_that_holds_their_replica() -> None:
    # node 1 is a spare with nothing; node 0 holds its own ranks and the lost node's replica (ring n0 <- lost)
    holdings = [holding(0, {20: [0, 1, 2, 3]}), holding(1, {})]
    choice = choose(holdings, 4, NODE_OF)
    assert choice == Choice(20, {0: 0, 1: 0, 2: 0, 3: 0})
    assert choice.moved(NODE_OF) == {2: 0, 3: 0}


def test_a_step_some_rank_lacks_everywhere_is_passed_over_and_none_when_no_step_is_whole() -> None:
    holdings = [holding(0, {25: [0, 1, 2], 20: [0, 1]}), holding(1, {20: [2, 3]})]
    assert choose(holdings, 4, NODE_OF) == Choice(20, {0: 0, 1: 0, 2: 1, 3: 1})
    assert choose([holding(0, {25: [0, 1]}), holding(1, {})], 4, NODE_OF) is None
    assert choose([holding(0, {}), holding(1, {})], 4, NODE_OF) is None
    assert missing(holdings, 4, 25) == [3] and missing(holdings, 4, 20) == []
    assert missing(holdings, 4, 7) == [0, 1, 2, 3]


def test_a_holding_reads_back_and_a_bad_one_is_named() -> None:
    h = holding(3, {7: [1, 2]})
    assert Holding.from_json(h.to_json(), "x") == h
    try:
        Holding.from_json('{"node": 1}', "attempts/1/ram/node-1.json")
    except ValueError as error:
        assert "attempts/1/ram/node-1.json: not a RAM holding" in str(error)
    else:
        raise AssertionError("a holding without its fields was taken")
