"""A rank's RAM snapshot files: a state staged, written and read back equals the state staged, whatever training
changed after the copy; a DTensor is kept as its local tensor and loaded in place; the buffers are kept between
snapshots; a data file cut short, a tensor of another shape and a value the snapshot lacks are refused."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from slurm_titan.rank import snapshot_files
from slurm_titan.rank.snapshot_files import DATA, Stager


class Counter:
    """A Stateful with no tensors."""

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
            "empty": torch.zeros(0, 3), "mask": torch.rand(7, generator=generator) > 0.5,
            "nested": [torch.full((2,), float(seed)), (seed, torch.arange(3) * seed)], "counter": Counter(seed)}


def _tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, dict):
        return {k: t for key, value in state.items() for k, t in _tensors(value, f"{prefix}{key}.").items()}
    if isinstance(state, (list, tuple)):
        return {k: t for i, value in enumerate(state) for k, t in _tensors(value, f"{prefix}{i}.").items()}
    return {prefix: state} if isinstance(state, torch.Tensor) else {}


def _saved(tmp_path: Path, state: dict[str, Any], stager: Stager | None = None) -> Path:
    snapshot_files.write((stager or Stager(accelerator=False)).stage(state), tmp_path / "snap")
    return tmp_path / "snap"


def test_a_state_read_back_equals_the_state_staged_whatever_training_changed_after(tmp_path: Path) -> None:
    saved, expected = _state(5), _tensors(_state(5))
    staged = Stager(accelerator=False).stage(saved)
    for tensor in _tensors(saved).values():  # training goes on while the copy is written
        tensor.zero_() if tensor.dtype != torch.bool else tensor.logical_not_()
    saved["optimizer"]["param_groups"][0]["lr"] = 9.0
    saved["counter"].value = 0
    snapshot_files.write(staged, tmp_path / "snap")
    loaded = _state(2)
    before = {key: tensor for key, tensor in _tensors(loaded).items()}
    snapshot_files.load(loaded, tmp_path / "snap")
    got = _tensors(loaded)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[key], got[key]) and expected[key].dtype == got[key].dtype for key in expected)
    assert all(got[key] is before[key] for key in got)  # loaded in place
    assert loaded["counter"].value == 5 and loaded["optimizer"]["param_groups"][0]["lr"] == 0.001
    assert loaded["nested"][1][0] == 5


def test_the_buffers_are_kept_from_one_snapshot_to_the_next_and_replaced_where_a_shape_changed() -> None:
    stager = Stager(accelerator=False)
    first = stager.stage({"a": torch.ones(3), "b": torch.ones(2, 2)}).tensors
    second = stager.stage({"a": torch.zeros(3), "b": torch.zeros(4)}).tensors
    assert second[0] is first[0] and torch.equal(second[0], torch.zeros(3))
    assert second[1] is not first[1] and second[1].shape == (4,)


@pytest.fixture
def mesh(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_a_dtensor_is_kept_as_its_local_tensor_and_loaded_in_place(tmp_path: Path, mesh: Any) -> None:
    weight = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)])
    folder = _saved(tmp_path, {"w": weight})
    target = distribute_tensor(torch.zeros(4, 3), mesh, [Shard(0)])
    state = {"w": target}
    snapshot_files.load(state, folder)
    assert state["w"] is target and isinstance(target, DTensor)
    assert torch.equal(target.to_local(), torch.arange(12.0).reshape(4, 3))


def test_a_data_file_cut_short_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path, _state(1))
    data = (folder / DATA).read_bytes()
    (folder / DATA).write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match=f"{folder / DATA} ends inside "):
        snapshot_files.load(_state(2), folder)


def test_a_tensor_of_another_shape_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path, {"layer": {"w": torch.ones(2, 3)}})
    with pytest.raises(ValueError, match=r"layer\.w: torch.float32 \[2, 3\] saved, torch.float32 \[3, 3\] to load"):
        snapshot_files.load({"layer": {"w": torch.zeros(3, 3)}}, folder)


def test_a_value_the_snapshot_lacks_is_refused_and_nothing_but_tensors_changed(tmp_path: Path) -> None:
    folder = _saved(tmp_path, {"w": torch.ones(2), "counter": Counter(3)})
    counter = Counter(0)
    with pytest.raises(ValueError, match="not in the snapshot: extra"):
        snapshot_files.load({"w": torch.zeros(2), "counter": counter, "extra": torch.zeros(1)}, folder)
    assert counter.value == 0


def test_a_container_of_tensors_saved_as_something_else_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path, {"layer": [torch.ones(2)], "lrs": [0.1, 0.2]})
    with pytest.raises(ValueError, match="layer: list saved, tuple of tensors to load"):
        snapshot_files.load({"layer": (torch.zeros(2),), "lrs": [0.3]}, folder)
    state = {"layer": [torch.zeros(2)], "lrs": [0.3]}  # a list of plain values takes the saved one, whatever its length
    snapshot_files.load(state, folder)
    assert state["lrs"] == [0.1, 0.2] and torch.equal(state["layer"][0], torch.ones(2))
