"""`python -m slurm_titan.doctor.probe_main`: print how many NPUs torch_npu sees (`torch.npu.device_count()`).

Run by the doctor in a child process with the ranks' Python and environment (ASCEND_RT_VISIBLE_DEVICES
applies), so that importing torch_npu never happens in the supervisor or the CLI and a hang is bounded.
"""

from __future__ import annotations


def main() -> None:
    import torch
    import torch_npu  # noqa: F401  registers torch.npu

    print(torch.npu.device_count())  # type: ignore[attr-defined]  # torch_npu adds torch.npu


if __name__ == "__main__":
    main()
