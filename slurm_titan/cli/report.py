"""`slurm-titan report JOB|RUN [--out FILE.html] [--png FILE.png]`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_titan.cli.base import SubCommand
from slurm_titan.errors import RunError, SlurmTitanError

if TYPE_CHECKING:
    from slurm_titan.report.data import RunReport

PNG_SIZE = (1400, 1800)
"""The PNG's width and height in CSS pixels: the numbers, the wall-time figure and the step figure."""


class Report(SubCommand):
    name = "report"
    help = ("one self-contained HTML page of a job, or of a run across its jobs: loss and throughput across "
            "attempts, where the time went, checkpoints, goodput")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="job id, or run name (every job of the run on one step axis and one clock)")
        parser.add_argument("--out", type=Path, help="the HTML page to write (default: report-JOB.html here)")
        parser.add_argument("--png", type=Path, help="also a picture of the page's top, by a headless Chromium")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.report import browser

        target, png = args.job, args.png
        report, title = _collect(target)
        try:
            from slurm_titan.report import page
        except ImportError as error:
            raise SlurmTitanError(f"report needs plotly ({error}): pip install 'slurm-titan[report]'") from None
        if png is not None and browser.find() is None:
            raise SlurmTitanError(f"--png needs Chromium, found none of {', '.join(browser.BROWSERS)} on PATH "
                                  "(Debian/Ubuntu: apt-get install chromium)")
        out = args.out or Path(f"report-{target}.html")
        try:
            out.write_text(page.render(report, title), encoding="utf-8")
        except OSError as error:
            raise SlurmTitanError(f"cannot write {out}: {error.strerror}") from None
        print(f"report: {out}")
        if png is not None:
            browser.screenshot(out, png, *PNG_SIZE)
            print(f"picture: {png}")
        return 0


def _collect(target: str) -> tuple[RunReport, str]:
    """The report of a job (an id), or of a run (a name: RunError when none is recorded here), and its title."""
    from slurm_titan.launch import run_view, status
    from slurm_titan.records import jobs, run_registry
    from slurm_titan.report import data

    if run_registry.name_problem(target):  # not a run name: a job id (digits)
        record = jobs.load(target)
        return (data.collect(record.folder, record.submitted),
                f"job {target} {record.name}: {status.describe(target)['state']}")
    run = run_registry.load(target)
    if run is None:
        raise RunError(f"no run {target} was submitted from here (slurm-titan runs lists the runs)")
    view = run_view.view(run, time.time())
    states = ", ".join(f"{info['job_id']} {info['state']}"
                       for info in status.describe_all([job.job_id for job in view.jobs]))
    return data.collect_run(view), f"run {target}: jobs {states or 'none recorded here'}"
