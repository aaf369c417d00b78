"""The preflight doctor: every node of every job checks itself and the nodes compare notes before training.

Per node: npu-smi (chips, health, driver, firmware, HBM, temperature), /dev/davinci*, CANN and its ops package,
driver / CANN / torch_npu compatibility (`versions`), torch_npu's device count, package versions, checkpoint disk
space, the RAM tier's memory (`MEMORY_CHECK`), network interfaces, HCCL ports (ephemeral and reserved ranges), and
with hccn_tool the NPUs' network ports (`facts`, `checks`); across nodes: same chips, driver, firmware, CANN, TLS
switch and versions, distinct device IPs, one NPU ping per node (`checks.compare_nodes`, `checks.reachability`),
exchanged through the job folder (`exchange`). A finding fails the preflight or is a warning (`report`). Nothing
here imports torch. Entry points for the supervisor and the CLI: `run_preflight`, `PreflightFailed`,
`DoctorExpectations` (exit code: `errors.ExitCode.PREFLIGHT`); for the batch shell's decision `read_verdict`,
`TRANSIENT_CHECKS`, `failures` and `node_rank`.
"""

from slurm_titan.doctor.checks import MEMORY_CHECK, TRANSIENT_CHECKS
from slurm_titan.doctor.exchange import read_verdict, run_preflight
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.report import Finding, PreflightFailed, failures, node_rank

__all__ = ["MEMORY_CHECK", "TRANSIENT_CHECKS", "DoctorExpectations", "Finding", "PreflightFailed", "failures",
           "node_rank", "read_verdict", "run_preflight"]
