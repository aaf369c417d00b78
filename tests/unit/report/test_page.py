"""`slurm-titan report`: the page in a real headless Chromium (it loads without a console message, its
plots are drawn, it fetches nothing), the PNG, the one-line errors, and the light CLI."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_titan.report
from slurm_titan.cli.main import main
from slurm_titan.launch import run_view
from slurm_titan.records import run_registry
from slurm_titan.report import browser, data
from tests.support.paths import REPO
from tests.support.recorded import resumed_run, submitted_runs, utc  # noqa: F401  (jobs 101..103: the recorded runs, in UTC)

needs_chromium = pytest.mark.skipif(browser.find() is None,
                                    reason="Chromium is not installed (tools/setup installs it)")


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is no PNG"
    return struct.unpack(">II", head[16:24])


@needs_chromium
def test_the_page_loads_without_console_messages_and_draws_its_plots(submitted_runs, tmp_path, capsys):  # noqa: F811
    page, png = tmp_path / "report.html", tmp_path / "report.png"  # the screenshot stays in the test's folder
    assert main(["report", "102", "--out", str(page), "--png", str(png)]) == 0
    assert capsys.readouterr().out == f"report: {page}\npicture: {png}\n"
    text = page.read_text()
    markup = re.sub(r"(<script[^>]*>).*?</script>", r"\1", text, flags=re.S)  # plotly.js is inlined
    assert "<script" in markup and not re.search(r"""\b(src|href)\s*=\s*["']?(https?:)?//""", markup)
    assert "job 102 crash-restart: COMPLETED" in text and "crashed on n2 rank 1 with SIGKILL" in text
    # every host name resolves to nothing (browser.run): a fetch would fail and log a console error
    result = browser.run(page, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if ":CONSOLE" in line] == []
    dom = result.stdout
    assert dom.count('class="main-svg"') >= 4  # the two figures' SVG layers
    # loss and throughput lines of both attempts in both figures, one timeline bar per phase, the checkpoint
    assert len(re.findall(r'<path class="js-line"', dom)) >= 8
    assert len(re.findall(r'<g class="point"><path d="M[^"]+"', dom)) >= 15
    assert dom.count("checkpoint committed") >= 2 and dom.count("SIGKILL -&gt; restart") >= 2
    assert png_size(png) == (1400, 1800) and png.stat().st_size > 50_000


def test_png_without_chromium_is_one_line_and_writes_nothing(submitted_runs, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(browser, "find", lambda: None)
    page = tmp_path / "report.html"
    assert main(["report", "101", "--out", str(page), "--png", str(tmp_path / "r.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("slurm-titan: --png needs Chromium") and err.count("\n") == 1
    assert not page.exists()


def test_report_without_plotly_says_which_extra(submitted_runs, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    monkeypatch.delitem(sys.modules, "slurm_titan.report.page", raising=False)
    monkeypatch.delattr(slurm_titan.report, "page", raising=False)
    assert main(["report", "101", "--out", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err
    assert "pip install 'slurm-titan[report]'" in err and err.count("\n") == 1


def test_an_unknown_job_or_an_unwritable_file_is_one_line(submitted_runs, tmp_path, capsys):  # noqa: F811
    assert main(["report", "999"]) == 1
    assert capsys.readouterr().err.startswith("slurm-titan: job 999 was not submitted by slurm-titan from here")
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["report", "101", "--out", str(blocked / "r.html")]) == 1
    assert capsys.readouterr().err == f"slurm-titan: cannot write {blocked / 'r.html'}: Not a directory\n"


def test_a_run_is_reported_across_its_jobs_on_one_step_axis_and_one_clock(submitted_runs, tmp_path,  # noqa: F811
                                                                         capsys):
    resumed_run(submitted_runs["preempted-requeued"], tmp_path / "resumed")
    whole = run_view.view(run_registry.load("exp"), 1735727760.0)  # type: ignore[arg-type]
    report = data.collect_run(whole)
    assert [(row["attempt"], report.job_of[row["attempt"]]) for row in report.attempts] == [
        (0, "101"), (1, "101"), (2, "104")]
    assert report.goodput == whole.goodput and report.submitted == whole.submitted
    queued = [p for p in report.phases if p.name == "queued" and p.attempt == 2]
    assert [(p.start, p.end) for p in queued] == [(1735727100.0, 1735727400.0)]  # the gap between the jobs, lost
    assert [(p.step, p.attempt) for p in report.steps] == [(step, 2) for step in range(101, 151, 10)]
    page = tmp_path / "run.html"
    assert main(["report", "exp", "--out", str(page)]) == 0
    assert capsys.readouterr().out == f"report: {page}\n"
    text = page.read_text()
    assert "run exp: jobs 101 COMPLETED, 104 COMPLETED" in text and "2 (job 104)" in text
    assert main(["report", "nosuchrun"]) == 2
    assert capsys.readouterr().err == ("slurm-titan: no run nosuchrun was submitted from here "
                                       "(slurm-titan runs lists the runs)\n")


PROBE = """
import sys, runpy
sys.argv = ["slurm-titan", *{args!r}]
try:
    runpy.run_module("slurm_titan.cli.main", run_name="__main__")
except SystemExit:
    pass
loaded = (m for m in sys.modules if m.split(".")[0] == "plotly" or m.startswith("slurm_titan.report"))
print("LOADED:", ",".join(sorted(loaded)), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["report", "--help"], ["runs", "--help"], ["status", "--help"]])
def test_only_the_report_command_loads_the_report(args):
    result = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert "LOADED: \n" in result.stderr, result.stderr
