"""The document tables the data loader makes on the host equal torchtitan's device-side varlen metadata."""

import torch
from torchtitan.models.common.attention import create_varlen_metadata_for_document

from slurm_titan.overrides.document_tables import OFFSETS_ATTRIBUTE, TabledInputs, host_varlen_metadata


def _random_positions(generator: torch.Generator, batch: int, seq_len: int) -> torch.Tensor:
    """Rows of packed documents of random lengths, positions from 0 in each (torchtitan's packing)."""
    rows = []
    for _ in range(batch):
        lengths, left = [], seq_len
        while left:
            lengths.append(min(left, int(torch.randint(1, seq_len + 1, (1,), generator=generator))))
            left -= lengths[-1]
        rows.append(torch.cat([torch.arange(n) for n in lengths]))
    return torch.stack(rows)


def test_host_tables_equal_torchtitans_metadata_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        batch, seq_len = int(torch.randint(1, 5, (1,), generator=generator)), int(torch.randint(1, 90, (1,)))
        positions = _random_positions(generator, batch, seq_len)
        got = host_varlen_metadata(TabledInputs({"positions": positions}).offsets)
        for expected in (create_varlen_metadata_for_document(positions),
                         create_varlen_metadata_for_document(positions, include_host_offsets=True)):
            assert torch.equal(got.cu_seq_q, expected.cu_seq_q) and torch.equal(got.cu_seq_k, expected.cu_seq_k)
            assert (got.max_q, got.max_k) == (expected.max_q, expected.max_k)
        assert got.cu_seq_q_host == tuple(expected.cu_seq_q.tolist()) == expected.cu_seq_q_host


def test_the_device_copy_of_positions_carries_the_tables():
    inputs = TabledInputs({"input": torch.zeros(1, 4), "positions": torch.tensor([[0, 1, 0, 1]])})
    device_copy = inputs["positions"].clone()
    inputs["positions"] = device_copy
    assert getattr(device_copy, OFFSETS_ATTRIBUTE) == (0, 2, 4)
    assert not hasattr(inputs["input"], OFFSETS_ATTRIBUTE)
