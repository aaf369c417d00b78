"""`slurm-titan`: submit torchtitan jobs to Slurm and look after them.

Light by design: nothing here imports torch or torchtitan, so the login-node commands answer
in well under a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from slurm_titan import __version__
from slurm_titan.errors import SlurmTitanError

Handler = Callable[[argparse.Namespace], int]


def _submit(args: argparse.Namespace) -> int:
    from slurm_titan.launch.config import load_config, parse_assignment
    from slurm_titan.launch.plan import plan_job

    overrides = [parse_assignment(text) for text in args.set]
    shorthands = {"slurm.nodes": args.nodes, "slurm.partition": args.partition, "slurm.time": args.time}
    overrides += [(key, value) for key, value in shorthands.items() if value is not None]
    plan = plan_job(load_config(args.config, overrides))
    if args.dry_run:
        print(plan, end="")
        return 0
    from slurm_titan.launch.submit import submit

    record = submit(plan)
    print(f"submitted job {record.job_id} ({record.name}, {record.nodes} node(s))")
    print(f"logs: {record.job_dir}  (slurm-titan logs {record.job_id} --follow)")
    return 0


def _status(args: argparse.Namespace) -> int:
    from slurm_titan.launch import status

    return status.show(args.job, as_json=args.json)


def _runs(args: argparse.Namespace) -> int:
    from slurm_titan.launch import runs

    return runs.show(limit=args.limit, as_json=args.json)


def _report(args: argparse.Namespace) -> int:
    from slurm_titan.cli import report_cmd

    return report_cmd.run(args.job, out=args.out, png=args.png)


def _logs(args: argparse.Namespace) -> int:
    from slurm_titan.launch import logs

    if args.stacks:
        return logs.show_stacks(args.job)
    return logs.show(args.job, rank=args.rank, follow=args.follow)


def _nodes(args: argparse.Namespace) -> int:
    from slurm_titan.records import ledger

    return ledger.show(args.cluster, as_json=args.json)


def _cancel(args: argparse.Namespace) -> int:
    from slurm_titan import slurm

    slurm.cancel(args.job)
    print(f"cancelled job {args.job}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from slurm_titan.cli.doctor_cmd import run

    return run(args)


def _check_overrides(args: argparse.Namespace) -> int:
    from slurm_titan.overrides.check import main as check_main

    return check_main(["--device", args.device, *(["--quick"] if args.quick else [])])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurm-titan", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slurm-titan {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = commands.add_parser("submit", help="submit a job config to Slurm")
    submit.add_argument("config", help="job config (YAML)")
    submit.add_argument("--nodes", type=int, help="number of nodes (overrides slurm.nodes)")
    submit.add_argument("--partition", help="Slurm partition (overrides slurm.partition)")
    submit.add_argument("--time", help="time limit, e.g. 04:00:00 (overrides slurm.time)")
    submit.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override any config key (repeatable), e.g. --set torchtitan.args.training.steps=20")
    submit.add_argument("--dry-run", action="store_true", help="print the sbatch script and node command; submit nothing")
    submit.set_defaults(handler=_submit)

    status = commands.add_parser("status", help="state of a job (or of recent jobs), across requeues")
    status.add_argument("job", nargs="?", help="job id (default: recent jobs)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_status)

    runs = commands.add_parser("runs", help="recent runs: job, name, state, step, last checkpoint, goodput")
    runs.add_argument("--limit", type=int, default=20, help="how many of the newest runs (default 20)")
    runs.add_argument("--json", action="store_true", help="machine-readable output")
    runs.set_defaults(handler=_runs)

    report = commands.add_parser("report", help="one self-contained HTML page of a run: loss and throughput across "
                                                 "attempts, where the time went, checkpoints, goodput")
    report.add_argument("job", help="job id")
    report.add_argument("--out", type=Path, help="the HTML page to write (default: report-JOB.html here)")
    report.add_argument("--png", type=Path, help="also a picture of the page's top, by a headless Chromium")
    report.set_defaults(handler=_report)

    logs = commands.add_parser("logs", help="show a job's logs")
    logs.add_argument("job", help="job id")
    logs.add_argument("--rank", type=int, help="one training rank's log (default: the node logs)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    logs.add_argument("--stacks", action="store_true",
                      help="the ranks' stacks the watchdog took on a hang (newest attempt that has them)")
    logs.set_defaults(handler=_logs)

    nodes = commands.add_parser("nodes", help="the node ledger: failures per node on this cluster, and the "
                                              "nodes new jobs keep off")
    nodes.add_argument("--cluster", help="another cluster's ledger (default: this cluster's ClusterName)")
    nodes.add_argument("--json", action="store_true", help="machine-readable output")
    nodes.set_defaults(handler=_nodes)

    cancel = commands.add_parser("cancel", help="cancel a job")
    cancel.add_argument("job", help="job id")
    cancel.set_defaults(handler=_cancel)

    from slurm_titan.cli.ckpt_cmd import register as register_ckpt
    from slurm_titan.cli.doctor_cmd import add_arguments as add_doctor_arguments

    register_ckpt(commands)

    doctor = commands.add_parser("doctor", help="check this node as every job's preflight does "
                                                "(NPUs, CANN, driver, versions, disk)")
    add_doctor_arguments(doctor)
    doctor.set_defaults(handler=_doctor)

    check = commands.add_parser("check-overrides", help="check the NPU overrides against torchtitan's "
                                                        "reference maths: on CPU through torch_npu's documented "
                                                        "contracts, or with --device npu on this node's NPU")
    check.add_argument("--quick", action="store_true", help="fewer random cases")
    check.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                       help="cpu: torch_npu's contract models; npu: torch_npu's kernels on an NPU")
    check.set_defaults(handler=_check_overrides)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except SlurmTitanError as error:
        print(f"slurm-titan: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
