"""The chip's own speed, timed on the device: one fixed matmul between two timing events, once a step.

The rank's wanted CPU time (records.schedstat) sees a slow host, not a slow chip: on an NPU the host only
launches kernels, then waits for its device as it waits for its peers, so a thermally throttled or degraded
chip shows as waiting. The probe is the same work at every step, on the stream the model runs on and with no
collective in it, so its device time grows with the chip's slowdown and not with a peer's. Its events are
read a step or more later with `query()`: the host never waits for the device here. The judge
(node.batch.straggler) scores each node's probe time per step against the other nodes', beside the host's.

The events are torch_npu's documented `torch.npu.Event(enable_timing=True)`: `record()` on the current
stream, `query()` (the stream has passed it), `elapsed_time(end)` in milliseconds; `torch.cuda.Event` has the
same contract. Cost on an Atlas 800T A2 (910B, ~300 TFLOPS bf16): 2 x 2048^3 flops = 17 GFLOP, ~60 us of
device time a step, against steps of seconds (computed from the chip's peak, not measured: no NPU here).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import torch

SIZE = 2048  # the probe's square matmul: long enough for the events' resolution, short against a step
MAX_PENDING = 4  # probes in flight at most: a device further behind than this is not probed more


class TimingEvent(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class DeviceProbe:
    """Times one `size` x `size` matmul on `device` at every :meth:`tick`, with the timing events of `module`
    (torch.npu, torch.cuda: its `Event(enable_timing=True)`)."""

    def __init__(self, module: Any, device: torch.device | str, *, size: int = SIZE,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self._module = module
        generator = torch.Generator().manual_seed(0)
        self._a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
        self._b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
        self._out = torch.empty_like(self._a)
        self._pending: deque[tuple[TimingEvent, TimingEvent]] = deque()
        self.total_s, self.count = 0.0, 0

    def tick(self) -> tuple[float, int]:
        """Read the probes the device has finished, start the next one; (device seconds, probes) so far."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            self.total_s += start.elapsed_time(end) / 1000.0
            self.count += 1
        if len(self._pending) < MAX_PENDING:
            start, end = self._module.Event(enable_timing=True), self._module.Event(enable_timing=True)
            start.record()
            torch.mm(self._a, self._b, out=self._out)
            end.record()
            self._pending.append((start, end))
        return self.total_s, self.count


_probe: DeviceProbe | None = None
_off = False


def tick() -> tuple[float, int]:
    """This rank's probe (made at the first call on an available accelerator; none on the CPU, where the host's
    time is the chip's): (device seconds, probes) so far, (0.0, 0) without one."""
    global _probe, _off
    if _probe is None and not _off:
        from torchtitan.tools.utils import device_module, device_type

        if device_type == "cpu" or not device_module.is_available():
            _off = True
        else:
            _probe = DeviceProbe(device_module, f"{device_type}:{device_module.current_device()}")
    return _probe.tick() if _probe is not None else (0.0, 0)
