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
        parser.add_argument("--run", metavar="NAME",
                            help="the run this job belongs to (overrides run:): its first job starts at step 1, every "
                                 "later one resumes from the newest complete checkpoint of the run's location")
        parser.add_argument("--resume", metavar="JOB|RUN|LOCATION",
                            help="continue a run, a job's checkpoints (from before runs had names too) or a "
                                 "checkpoint location (with --run NAME); refused when there is none")
        parser.add_argument("--fresh", action="store_true",
                            help="start at step 1; refused where the location holds a complete checkpoint")
        parser.add_argument("--take-over", action="store_true",
                            help="take the location's writer lease from a job that Slurm does not say runs")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the sbatch script and node command; submit nothing")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.launch.config import load_config, parse_assignment
        from slurm_titan.launch.plan import plan_job
        from slurm_titan.launch.run_binding import bind

        overrides = [parse_assignment(text) for text in args.set]
        shorthands = {"slurm.nodes": args.nodes, "slurm.partition": args.partition, "slurm.time": args.time}
        overrides += [(key, value) for key, value in shorthands.items() if value is not None]
        config, binding = bind(load_config(args.config, overrides), run=args.run, resume=args.resume,
                               fresh=args.fresh)
        plan = plan_job(config, take_over=args.take_over)
        if args.dry_run:
            print(plan, end="")
            return 0
        from slurm_titan.launch.submit import submit

        record = submit(plan, binding)
        run = f", run {record.run}" if record.run else ""
        print(f"submitted job {record.job_id} ({record.name}{run}, {record.nodes} node(s))")
        print(f"logs: {record.job_dir}  (slurm-titan logs {record.job_id} --follow)")
        return 0
