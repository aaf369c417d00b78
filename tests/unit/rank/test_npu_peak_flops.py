"""MFU on Ascend: the chip's documented BF16 peak, or a warning and MFU 0, never an A100's 312 TFLOPS."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torchtitan.components.metrics
import torchtitan.tools.logging
import torchtitan.trainer
from torchtitan.tools import utils as titan_utils

from slurm_titan.rank import entry, npu_peak_flops
from slurm_titan.rank.npu_peak_flops import npu_get_peak_flops, peak_flops

DOCUMENTED = [  # torch.npu.get_device_name() on each chip -> torchtitan-npu's figure
    ("Ascend910B1", 373.88e12),
    ("Ascend910B2", 353.8944e12),
    ("Ascend910B3", 294.912e12),
    ("Ascend910B4", 245.76e12),
    ("Ascend910_9392", 353.8944e12),
    ("Ascend950PR", 432e12),
    ("Ascend950DT", 486e12),
]
UNDOCUMENTED = ["Ascend910B2C", "Ascend910B4-1", "Ascend910_9391", "Ascend910_9382", "Ascend910A", "Ascend310P3",
                "Ascend910_9362"]


CUBE_CORES_AND_CLOCK = {"Ascend910B2": (24, 1.8e9), "Ascend910B3": (20, 1.8e9), "Ascend910B4": (20, 1.5e9)}
"""Cube cores (MindStudio's chip table) and clock, as the second NPU audit (issue 22) reads them."""


@pytest.mark.parametrize("name", CUBE_CORES_AND_CLOCK)
def test_910b_figures_are_cube_cores_times_8192_flop_per_cycle_times_clock(name: str) -> None:
    cores, clock = CUBE_CORES_AND_CLOCK[name]
    assert peak_flops(name) == cores * 8192 * clock


@pytest.mark.parametrize(("name", "flops"), DOCUMENTED)
def test_documented_chips(name: str, flops: float) -> None:
    assert peak_flops(name) == flops


@pytest.mark.parametrize("name", UNDOCUMENTED)
def test_undocumented_chips_have_no_figure(name: str) -> None:
    assert peak_flops(name) is None


@pytest.fixture
def restore_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo the installation after the test; give torchtitan's warn_once a fresh memory."""
    monkeypatch.setattr(titan_utils, "get_peak_flops", titan_utils.get_peak_flops)
    monkeypatch.setattr(torchtitan.tools.logging, "_logged", set())


def _lookups() -> list:
    """The lookup as both torchtitan callers reach it (``utils.get_peak_flops``)."""
    return [torchtitan.components.metrics.utils.get_peak_flops, torchtitan.trainer.utils.get_peak_flops]


def test_install_reaches_both_callers(restore_lookup) -> None:
    npu_peak_flops.install()
    for lookup in _lookups():
        assert [lookup(name) for name, _ in DOCUMENTED] == [flops for _, flops in DOCUMENTED]


def test_unknown_chip_warns_once_and_reports_mfu_zero(restore_lookup, caplog: pytest.LogCaptureFixture) -> None:
    npu_peak_flops.install()
    peaks = [lookup("Ascend910_9391") for lookup in _lookups()]
    assert peaks == [math.inf, math.inf]
    assert [r.getMessage() for r in caplog.records if "MFU not known" in r.getMessage()] == [
        "MFU not known for Ascend910_9391: no documented BF16 peak, mfu(%) is reported as 0"]
    num_flops_per_token, tps = 6 * 8e9, 3000.0
    assert 100 * num_flops_per_token * tps / peaks[0] == 0.0  # torchtitan's MFU formula (metrics.py)


def test_a_doubtful_figure_is_left_out_with_the_reason(restore_lookup, caplog: pytest.LogCaptureFixture) -> None:
    """The 910_9362 has 20 cube cores: at most ~295 TFLOPS, not torchtitan-npu's 353.9."""
    assert npu_get_peak_flops("Ascend910_9362") == math.inf
    [message] = [r.getMessage() for r in caplog.records if "MFU not known" in r.getMessage()]
    assert message.startswith("MFU not known for Ascend910_9362: torchtitan-npu's 353.9 TFLOPS is more than its 20 "
                              "cube cores") and message.endswith("mfu(%) is reported as 0")


def test_prepare_device_installs_it_for_npu(restore_lookup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))  # no torch_npu here
    entry.prepare_device("npu")
    assert titan_utils.get_peak_flops is npu_get_peak_flops
