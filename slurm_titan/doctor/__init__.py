"""The preflight doctor: every node of every job checks itself and the nodes compare notes before training.

Per node: npu-smi (chips, health, driver, firmware, HBM, temperature), CANN, torch_npu's device count,
package versions, checkpoint disk space, network interfaces and HCCL ports (`facts`, `checks`); across
nodes: same chips, driver, firmware, CANN and versions (`checks.compare_nodes`), exchanged through the
job folder (`exchange`). Nothing here imports torch. Entry points for the supervisor and the CLI:
`run_preflight`, `PreflightFailed`, `PREFLIGHT_EXIT_CODE`, `DoctorExpectations`, `cli.main`.
"""

from slurm_titan.doctor.exchange import run_preflight
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.report import Failure, PreflightFailed
from slurm_titan.npu_env import PREFLIGHT_EXIT_CODE

__all__ = ["PREFLIGHT_EXIT_CODE", "DoctorExpectations", "Failure", "PreflightFailed", "run_preflight"]
