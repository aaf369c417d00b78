"""Positions of a sample cut by the checkpoint, wherever a reshard puts its rest
(tests/integration/overrides/test_resharding_loader.py's
id samples: token j of sample i is i * 1000 + j).

Uninterrupted, the rest of a cut sample starts the next sequence of its rank, and torchtitan's per-sequence
normalisation counts its positions from 0. After a reshard the rest of another old rank's cut sample can land
mid-sequence: it is counted from 0 there too (counted from its token offset, a long sample's positions would
pass seq_len, the end of the RoPE cache)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")

from tests.integration.overrides.test_resharding_loader import SEQ, batches, checkpoint, loader, resumed, write_samples  # noqa: E402


def runs(got: list) -> list[tuple[int, list[int], list[int], bool]]:
    """(sample id, token indices, positions, whether it starts the sequence) of each sample's run in each
    yielded sequence."""
    out: list[tuple[int, list[int], list[int], bool]] = []
    for inputs, _ in got:
        for sequence, positions in zip(inputs["input"].tolist(), inputs["positions"].tolist()):
            for place, (token, position) in enumerate(zip(sequence, positions)):
                ident, index = divmod(token, 1000)
                if place == 0 or ident != out[-1][0]:
                    out.append((ident, [], [], place == 0))
                out[-1][1].append(index)
                out[-1][2].append(position)
    return out


@pytest.mark.parametrize(("old", "new"), [(2, 1), (4, 1), (4, 2), (2, 4)])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_the_rest_of_a_cut_sample_counts_its_positions_from_0_wherever_it_lands(tmp_path, old, new, steps) -> None:
    write_samples(tmp_path, 240)
    first = [loader(tmp_path, old, r) for r in range(old)]
    for ld in first:
        batches(iter(ld), steps)
    after = [run for ld in resumed(tmp_path, checkpoint(first), new) for run in runs(batches(iter(ld), None))]
    if (old, new) == (2, 1):  # old rank 1's cut sample goes on after old rank 0's rest: mid-sequence
        assert any(tokens[0] and not starts for _, tokens, _, starts in after)
    for ident, tokens, positions, _ in after:
        assert tokens == list(range(tokens[0], tokens[0] + len(tokens))), (ident, tokens)
        assert positions == list(range(len(positions))), (ident, tokens, positions)
        assert max(positions) < SEQ
