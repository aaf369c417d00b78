"""What the preflight expects of every node (no torch; pickled into the job). `launch.preflight` derives it from
the job config; the doctor CLI without a config uses the defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

GB = 10**9


@dataclass(frozen=True)
class DoctorExpectations:
    """The config's side of every check; an empty or None field skips its check.

    `visible_devices` empty means every chip. `hccl_port_ranges` are the HCCL port blocks HCCL binds on the host,
    judged against the host's ephemeral range: HCCL_HOST_SOCKET_PORT_RANGE and HCCL_IF_BASE_PORT's root-info
    ports (CANN: "the start port number of the host NIC"). HCCL_NPU_SOCKET_PORT_RANGE is not among them: those
    ports are bound on the NPU's own network port, which the host's net.ipv4 settings do not govern, and no
    hccn_tool query known here (tests/data/hccn_tool/) shows that port's ranges, so it is not judged at all.
    The master port is judged by the supervisor (`node.supervisor.rendezvous.check_port_outside`).
    `checkpoint_dir` is where torchtitan saves (it may hold the plan's
    job placeholders until `for_job`); `checkpoint_bytes` is the free space each node needs there: its share
    of one checkpoint (`checkpoint.expected_size_gb`, or estimated from the model's parameter count).
    """

    device: str = "npu"
    devices_per_node: int | None = None
    visible_devices: tuple[int, ...] = ()
    socket_ifnames: tuple[str, ...] = ()
    hccl_port_ranges: tuple[tuple[int, int], ...] = ()
    ascend_home: str = "/usr/local/Ascend"
    checkpoint_dir: str | None = None
    checkpoint_bytes: int | None = None
    checkpoint_size_source: str = ""
    memory_dir: str | None = None
    memory_bytes: int | None = None
    memory_required: bool = True
    """The RAM tier (`checkpoint.memory`): its folder (a tmpfs), the bytes each node needs there (its share of one
    checkpoint, own and partner's, for the step every rank holds twice and the one being written: 4x), and whether
    too little fails the node (else a warning, and the run goes on store-only). Host memory must also hold the
    ranks' staging copy (one more share): 5x of MemAvailable."""
    standby_bytes: int | None = None
    """Host memory a standby step's ranks hold (`preemption.standby_step`: one imported process per rank, beside
    the training's), checked with the RAM tier's against MemAvailable; too little is a warning."""
    check_kernels: bool = False
    """`doctor.check_kernels`: run the override checks on this node's first NPU (`python -m
    slurm_titan.overrides.check`, a child process: the doctor never imports torch)."""
    busy_wait_s: float = 120.0
    """How long the doctor waits for the judged chips to be released before it judges them busy: a rank killed
    at the end of the attempt before (or by a hang's kill) may hold its HBM until its driver context is torn down."""
    temp_warn_c: int = 75
    temp_fail_c: int = 85
    """Chip temperature limits: seed 000 ("正常应该在75°C以下,如果到85°C以上,NPU会降频": normal below
    75 C, above 85 C the NPU throttles). At `temp_warn_c` or more a warning, at `temp_fail_c` or more a failure."""

    def for_job(self, fill: Callable[[str], str]) -> DoctorExpectations:
        """These expectations with the job's placeholders filled in (`fill`, e.g. `lambda t: spec.fill(t, job_id)`)."""
        return self if self.checkpoint_dir is None else replace(self, checkpoint_dir=fill(self.checkpoint_dir))
