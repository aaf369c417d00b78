"""The dispatch mode that stands in, on CPU, for what Ascend's kernels refuse."""

import pytest
import torch

from slurm_titan.overrides.npu_capabilities import AscendUnsupportedError, RefuseAscendUnsupported

CACHE = torch.polar(torch.ones(8, 4), torch.rand(8, 4))
POSITIONS = torch.tensor([[0, 1, 2, 0, 1]])


@pytest.mark.parametrize(
    "op, name",
    [
        (lambda: CACHE[POSITIONS[0]], "aten.index.Tensor"),
        (lambda: CACHE.index_select(0, POSITIONS[0]), "aten.index_select"),
        (lambda: torch.gather(CACHE, 0, POSITIONS.T.expand(5, 4)), "aten.gather"),
    ],
)
def test_complex_index_and_gather_are_refused_as_documented_gaps(op, name):
    with RefuseAscendUnsupported(), pytest.raises(AscendUnsupportedError, match=f"{name}.*no complex kernel"):
        op()


def test_other_complex_kernels_are_refused_views_and_real_ops_pass():
    with RefuseAscendUnsupported():
        angles = torch.view_as_real(CACHE)[None, :5]  # views only
        rows = angles.index_select(1, POSITIONS[0])  # real index_select
        with pytest.raises(AscendUnsupportedError, match="aten.mul.*not verified"):
            CACHE * CACHE
    assert rows.shape == (1, 5, 4, 2)
    CACHE * CACHE  # outside the mode nothing is refused
