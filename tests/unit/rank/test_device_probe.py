"""The chip probe (rank.device_probe) against an executable model of the documented timing-event contract
(torch.npu.Event / torch.cuda.Event: `record()` on the current stream, `query()` True once the stream passed
the event or when it was never recorded, `elapsed_time(end)` in ms between two completed events, an error
before). The model's device runs only when the test says so, so that a probe which waited for the device
would be seen: the model has no way to wait."""

from __future__ import annotations

import pytest
import torch

from slurm_titan.rank.device_probe import MAX_PENDING, DeviceProbe


class ModelStream:
    """One stream: the probe's kernel between a start and an end event takes `kernel_s` of device time; the
    device has run `done_s` of what was queued."""

    def __init__(self, kernel_s: float) -> None:
        self.kernel_s, self.queued_s, self.done_s, self._open = kernel_s, 0.0, 0.0, False

    def run(self, seconds: float | None = None) -> None:
        self.done_s = self.queued_s if seconds is None else min(self.queued_s, self.done_s + seconds)

    def mark(self) -> float:
        if self._open:  # an end event: the kernel between the two is queued first
            self.queued_s += self.kernel_s
        self._open = not self._open
        return self.queued_s


class ModelDevice:
    def __init__(self, kernel_s: float) -> None:
        self.stream = ModelStream(kernel_s)

    def Event(self, *, enable_timing: bool) -> ModelEvent:  # noqa: N802  (torch's name)
        assert enable_timing, "elapsed_time needs enable_timing=True"
        return ModelEvent(self.stream)


class ModelEvent:
    def __init__(self, stream: ModelStream) -> None:
        self.stream, self.at = stream, None

    def record(self) -> None:
        self.at = self.stream.mark()

    def query(self) -> bool:
        return self.at is None or self.stream.done_s >= self.at

    def elapsed_time(self, end: ModelEvent) -> float:
        if self.at is None or end.at is None or not (self.query() and end.query()):
            raise RuntimeError("both events must be recorded and completed")
        return (end.at - self.at) * 1000.0


def probe(device: ModelDevice) -> DeviceProbe:
    return DeviceProbe(device, "cpu", size=32, dtype=torch.float32)


def test_probe_time_is_the_chips_time_per_probe_and_grows_with_its_slowdown() -> None:
    healthy, throttled = ModelDevice(60e-6), ModelDevice(90e-6)
    readings = {}
    for name, device in (("healthy", healthy), ("throttled", throttled)):
        p = probe(device)
        for _ in range(20):
            p.tick()
            device.stream.run()  # the step's own work keeps the device busy; it finishes before the next tick
        readings[name] = p.tick()
    assert readings["healthy"][1] == readings["throttled"][1] == 20
    per_probe = {name: total / count for name, (total, count) in readings.items()}
    assert per_probe["healthy"] == pytest.approx(60e-6)
    assert per_probe["throttled"] / per_probe["healthy"] == pytest.approx(1.5)


def test_the_host_never_waits_and_a_device_far_behind_is_not_probed_more() -> None:
    device = ModelDevice(60e-6)
    p = probe(device)
    for _ in range(10):
        assert p.tick() == (0.0, 0)  # nothing finished: nothing read, nothing waited for
    assert device.stream.queued_s == pytest.approx(MAX_PENDING * 60e-6)  # at most MAX_PENDING in flight
    device.stream.run(60e-6 * 1.5)  # the first probe finished, the second is half way
    assert p.tick() == (pytest.approx(60e-6), 1)  # read, and one more probe queued in its place
    device.stream.run()
    total, count = p.tick()
    assert count == MAX_PENDING + 1 and total == pytest.approx(count * 60e-6)


def test_the_probe_is_a_real_matmul_of_fixed_inputs() -> None:
    p = probe(ModelDevice(1e-6))
    p.tick()
    assert torch.equal(p._out, p._a @ p._b)
    assert torch.equal(probe(ModelDevice(1e-6))._a, p._a)  # the same work on every rank and every step
