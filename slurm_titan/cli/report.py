"""`slurm-titan report JOB [--out FILE.html] [--png FILE.png]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurm_titan.cli.base import SubCommand
from slurm_titan.errors import SlurmTitanError

PNG_SIZE = (1400, 1800)
"""The PNG's width and height in CSS pixels: the numbers, the wall-time figure and the step figure."""


class Report(SubCommand):
    name = "report"
    help = ("one self-contained HTML page of a run: loss and throughput across attempts, where the time went, "
            "checkpoints, goodput")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="job id")
        parser.add_argument("--out", type=Path, help="the HTML page to write (default: report-JOB.html here)")
        parser.add_argument("--png", type=Path, help="also a picture of the page's top, by a headless Chromium")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.launch import status
        from slurm_titan.records import jobs
        from slurm_titan.report import browser, data

        job_id, png = args.job, args.png
        record = jobs.load(job_id)
        try:
            from slurm_titan.report import page
        except ImportError as error:
            raise SlurmTitanError(f"report needs plotly ({error}): pip install 'slurm-titan[report]'") from None
        if png is not None and browser.find() is None:
            raise SlurmTitanError(f"--png needs Chromium, found none of {', '.join(browser.BROWSERS)} on PATH "
                                  "(Debian/Ubuntu: apt-get install chromium)")
        state = status.describe(job_id)["state"]
        out = args.out or Path(f"report-{job_id}.html")
        report = data.collect(record.folder, record.submitted)
        try:
            out.write_text(page.render(report, f"job {job_id} {record.name}: {state}"), encoding="utf-8")
        except OSError as error:
            raise SlurmTitanError(f"cannot write {out}: {error.strerror}") from None
        print(f"report: {out}")
        if png is not None:
            browser.screenshot(out, png, *PNG_SIZE)
            print(f"picture: {png}")
        return 0
