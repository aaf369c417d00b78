"""`slurm-titan submit CONFIG`: plan a job from its config and submit it to Slurm (or print the plan)."""

from __future__ import annotations

import argparse

from slurm_titan.cli.base import SubCommand


class Submit(SubCommand):
    name = "submit"
    help = "submit a job config to Slurm"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help="job config (YAML)")
        parser.add_argument("--nodes", type=int, help="number of nodes (overrides slurm.nodes)")
        parser.add_argument("--partition", help="Slurm partition (overrides slurm.partition)")
        parser.add_argument("--time", help="time limit, e.g. 04:00:00 (overrides slurm.time)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                            help="override any config key (repeatable), e.g. --set torchtitan.args.training.steps=20")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the sbatch script and node command; submit nothing")

    def run(self, args: argparse.Namespace) -> int:
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
