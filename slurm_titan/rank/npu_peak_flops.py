"""The Ascend chips' peak BF16 FLOPS for torchtitan's MFU, installed for npu jobs.

torchtitan 0.3.0's ``torchtitan.tools.utils.get_peak_flops`` knows no Ascend chip
and falls back to an A100's 312 TFLOPS. Its two callers,
``MetricsProcessor.__init__`` (``torchtitan.components.metrics``) and
``Trainer.__init__`` (``torchtitan.trainer``), both call it as
``utils.get_peak_flops`` on that module, so :func:`install` replaces it there.

Figures: the dense BF16 Cube peak per device, keyed by the SoC name
``torch.npu.get_device_name()`` returns, as torchtitan-npu tabulates them
(``torchtitan_npu/patches/tools/metrics.py``; the Ascend 950 rows from its later
``torchtitan_npu/extensions/tools/utils.py``, which cites the 950 whitepaper's
Table 3-1). The 910B rows each equal cube cores x 8192 FLOP/cycle x clock.
Any other name (910B2C, 910B4-1, the other 910_93xx) has no documented figure,
and the 910_9362's (353.9 TFLOPS) is more than its 20 cube cores allow
(`DOUBTFUL`): their MFU is reported as 0 and one warning says why, rather than
a figure measured against someone else's chip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

ASCEND_BF16_PEAK_FLOPS: Mapping[str, float] = MappingProxyType({
    "Ascend910B1": 373.88e12,
    "Ascend910B2": 353.8944e12,
    "Ascend910B3": 294.912e12,
    "Ascend910B4": 245.76e12,
    "Ascend910_9392": 353.8944e12,  # Atlas A3
    "Ascend950PR": 432e12,
    "Ascend950PR_9582": 432e12,
    "Ascend950DT": 486e12,
    "Ascend950DT_9582": 486e12,
})
"""Dense BF16 peak FLOPS per device, by exact SoC name."""
DOUBTFUL: Mapping[str, str] = MappingProxyType({
    "Ascend910_9362": "torchtitan-npu's 353.9 TFLOPS is more than its 20 cube cores x 8192 FLOP/cycle x 1.8 GHz "
                      "(294.9 TFLOPS) allow, and no other source gives a figure",
})
"""Chips whose published peak is left out, and why."""


def peak_flops(device_name: str) -> float | None:
    """The chip's documented peak, or ``None`` when none is documented."""
    return ASCEND_BF16_PEAK_FLOPS.get(device_name.strip())


def npu_get_peak_flops(device_name: str) -> float:
    """torchtitan's ``get_peak_flops`` for Ascend: the table, else infinity (MFU 0) and one warning saying why."""
    flops = peak_flops(device_name)
    if flops is not None:
        return flops
    from torchtitan.tools.logging import logger, warn_once

    why = DOUBTFUL.get(device_name.strip(), "no documented BF16 peak")
    warn_once(logger, f"MFU not known for {device_name}: {why}, mfu(%) is reported as 0")
    return math.inf


def install() -> None:
    """Make torchtitan look peaks up in the Ascend table; call after ``import torch_npu``.

    torchtitan picks its device when ``torchtitan.tools.utils`` is first imported,
    so that import must come after torch_npu registers the ``npu`` device.
    """
    from torchtitan.tools import utils

    utils.get_peak_flops = npu_get_peak_flops
