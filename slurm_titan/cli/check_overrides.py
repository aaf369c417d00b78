"""`slurm-titan check-overrides [--device npu]`: the NPU overrides against torchtitan's reference maths.

The checks (torch, torchtitan) live in `slurm_titan.overrides.check`, imported only when this command runs.
"""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class CheckOverrides(SubCommand):
    name = "check-overrides"
    help = ("check the NPU overrides against torchtitan's reference maths: on CPU through torch_npu's documented "
            "contracts, or with --device npu on this node's NPU")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="fewer random cases")
        parser.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                            help="cpu: torch_npu's contract models; npu: torch_npu's kernels on an NPU")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.overrides import check

        return check.run(args.device, quick=args.quick)
