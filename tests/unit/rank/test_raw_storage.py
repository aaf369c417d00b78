"""The RAM tier's snapshot storage: DCP's save and load (no process group) through raw bytes, against the state
saved; a data file cut short and a shape that does not match are refused."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from slurm_titan.rank.raw_storage import DATA, RawReader, RawWriter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Counter:
    """A Stateful with no tensors: DCP pickles its state."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "blob": io.BytesIO(b"x" * self.value).getvalue()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def _state(seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 6, generator=generator)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "half": torch.randn(5, 3, generator=generator).to(torch.bfloat16),
            "strided": torch.randn(4, 6, generator=generator).t(), "scalar": torch.tensor(seed),
            "empty": torch.zeros(0, 3), "mask": torch.rand(7, generator=generator) > 0.5}


def _tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, dict):
        return {k: t for key, value in state.items() for k, t in _tensors(value, f"{prefix}{key}.").items()}
    return {prefix: state} if isinstance(state, torch.Tensor) else {}


def test_a_state_read_back_equals_the_state_written(tmp_path: Path) -> None:
    saved, loaded = {**_state(1), "counter": Counter(5)}, {**_state(2), "counter": Counter(0)}
    dcp.save(saved, storage_writer=RawWriter(tmp_path / "snap"), no_dist=True)
    dcp.load(loaded, storage_reader=RawReader(tmp_path / "snap"), no_dist=True)
    expected, got = _tensors(saved), _tensors(loaded)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[key], got[key]) and expected[key].dtype == got[key].dtype for key in expected)
    assert loaded["counter"].value == 5 and loaded["optimizer"]["param_groups"] == saved["optimizer"]["param_groups"]


def test_a_data_file_cut_short_is_refused(tmp_path: Path) -> None:
    dcp.save(_state(1), storage_writer=RawWriter(tmp_path), no_dist=True)
    data = (tmp_path / DATA).read_bytes()
    (tmp_path / DATA).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointException) as raised:
        dcp.load(_state(2), storage_reader=RawReader(tmp_path), no_dist=True)
    assert f"{tmp_path / DATA} ends inside" in str(raised.value.failures)


def test_a_tensor_of_another_shape_is_refused(tmp_path: Path) -> None:
    dcp.save({"w": torch.ones(2, 3)}, storage_writer=RawWriter(tmp_path), no_dist=True)
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"w": torch.zeros(3, 3)}, storage_reader=RawReader(tmp_path), no_dist=True)
    refused = "Size mismatch between saved torch.Size([2, 3]) and current: torch.Size([3, 3])"
    assert refused in str(raised.value.failures)


def test_the_thread_that_writes_takes_the_writers_nice_and_the_caller_keeps_its_own(tmp_path: Path) -> None:
    seen: dict[str, int] = {}

    def save() -> None:  # DCP writes in the thread that saves (an async save's is a thread of its own)
        dcp.save(_state(1), storage_writer=RawWriter(tmp_path / "snap", nice=7), no_dist=True)
        seen["writer"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=save)
    thread.start(), thread.join()
    assert seen["writer"] == min(19, own + 7)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
