"""The rank's import of torchtitan's entry point: the cyclic collector off while it imports, on after, what the
import made frozen out of later collections (slurm_titan.rank.entry.import_trainer); a standby step's rank imports
in a thread at the background priority, its failure raised in the main thread."""

from __future__ import annotations

import gc
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator

import pytest

from slurm_titan.rank import entry
from slurm_titan.thread_priority import BACKGROUND_NICE


@pytest.fixture
def trainer_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for torchtitan.train (the real one is imported by every end-to-end rank); the freeze undone."""
    module = types.ModuleType("torchtitan.train")
    module.main = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchtitan.train", module)
    yield module
    gc.unfreeze()


def test_the_trainer_is_imported_with_the_collector_off_then_frozen(trainer_module: types.ModuleType,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(entry, "prepare_device", lambda device: seen.append((device, gc.isenabled())))
    gc.unfreeze()
    assert entry.import_trainer("cpu") is trainer_module.main
    assert seen == [("cpu", False)]  # the device prepared (torch_npu imported) with the collector off too
    assert gc.isenabled() and gc.get_freeze_count() > 0


@pytest.mark.parametrize("importer", [entry.import_trainer, lambda device: entry.import_in_background(device).result()])
def test_a_failed_import_is_raised_in_the_main_thread_with_the_collector_back_on(
        importer: Callable[[str], object], trainer_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(device: str) -> None:
        raise ImportError("No module named 'torch_npu'")

    monkeypatch.setattr(entry, "prepare_device", fail)
    with pytest.raises(ImportError, match="torch_npu"):
        importer("npu")
    assert gc.isenabled()


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_standby_ranks_import_runs_at_the_background_nice_and_its_main_thread_keeps_its_own(
        trainer_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, bool]] = []
    monkeypatch.setattr(entry, "prepare_device", lambda device: seen.append(
        (device, _nice(), threading.current_thread() is threading.main_thread())))
    own = _nice()
    assert entry.import_in_background("cpu").result(10) is trainer_module.main
    assert seen == [("cpu", min(19, own + BACKGROUND_NICE), False)]
    assert _nice() == own
