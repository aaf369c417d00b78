"""`status` shows goodput and each attempt's lost time; `runs` lists recent runs, on recorded run folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from slurm_titan.cli.main import main
from slurm_titan.launch import runs
from slurm_titan.records import history
from tests.support.cli import PROBE
from tests.support.paths import REPO
from tests.support.recorded import resumed_run, submitted_runs  # noqa: F401  (jobs 101..103: the recorded runs)


def test_status_shows_goodput_and_time_lost_per_attempt(submitted_runs, capsys):
    assert main(["status", "102"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("job 102 crash-restart: COMPLETED (from run record)") and out[0].endswith(" goodput=69.4%")
    assert out[2] == ("    time: lost 100s = queue 30s + start-up 60s + retrained 0s + stopping 10s;"
                      " training 360s, 37 new steps")
    assert out[4] == ("    time: lost 160s = queue 10s + start-up 80s + retrained 60s (7 steps) + stopping 10s;"
                      " training 290s, 23 new steps")
    assert main(["status", "102", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["goodput"] == {"goodput": 0.6941, "wall_s": 850.0, "productive_s": 590.0, "lost_s": 260.0}
    assert [t["lost_s"] for t in info["attempt_times"]] == [100.0, 160.0]
    assert info["attempt_times"][1]["retrained_steps"] == 7 and info["attempts"][0]["steps_retrained"] == 7


def test_status_names_the_slow_node_and_what_was_done(submitted_runs, capsys):
    history.append_event(submitted_runs["crash-restart"], "slow", 1, host="n2", score=0.61, step=50, since_step=41,
                         action="alert", why="no spare node left in the allocation")
    assert main(["status", "102"]) == 0
    assert ("    slow node n2: score 0.61 over steps 41..50 -> alert (no spare node left in the allocation)"
            in capsys.readouterr().out.splitlines())


def test_runs_lists_job_name_state_step_checkpoint_goodput(submitted_runs, monkeypatch, capsys):
    # rank 0's uploader logged two commits during attempt 1 of the running job
    log = submitted_runs["node-lost-running"] / "logs" / "rank-0.log"
    log.parent.mkdir()
    log.write_text("".join(f"[rank0]: checkpoint step {s} committed: 5 file(s), 1.0 MiB at s3://b/r/step-{s}\n"
                           f"[rank0]: step: {s + 1}  loss: 3.0\n" for s in (25, 30)))
    monkeypatch.setattr(runs, "TAIL_BLOCK", 16)  # read it backwards in small blocks
    assert main(["runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["JOB", "NAME", "RUN", "STATE", "STEP", "CHECKPOINT", "GOODPUT"]
    assert [line.split()[:6] for line in out[1:]] == [["103", "node-lost-running", "-", "UNKNOWN", "40", "30"],
                                                      ["102", "crash-restart", "-", "COMPLETED", "60", "30"],
                                                      ["101", "preempted-requeued", "-", "COMPLETED", "100", "50"]]
    assert out[3].split()[6] == "65.3%" and out[2].split()[6] == "69.4%"
    assert main(["runs", "--json", "--limit", "1"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["job_id"], row["step"], row["last_checkpoint"]) == ("103", 40, 30)


def test_a_run_of_two_jobs_is_one_line_of_runs_with_its_goodput_over_both_and_the_gap(submitted_runs, tmp_path,
                                                                                     capsys):
    alone = resumed_run(submitted_runs["preempted-requeued"], tmp_path / "resumed")
    assert main(["runs", "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)
    assert [(line["run"], line["jobs"]) for line in lines] == [("exp", ["101", "104"]), (None, ["103"]),
                                                               (None, ["102"])]
    run = lines[0]
    assert (run["state"], run["step"], run["last_checkpoint"]) == ("COMPLETED", 150, 100)
    wall = 1735727760.0 - 1735725600.0  # 101's submit -> 104's end: the 300 s between them included
    assert run["goodput"] == round((alone.productive_s + 300.0) / wall, 4) < alone.ratio  # type: ignore[operator]
    assert main(["runs"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["101,104", "preempted-requeued", "exp",
                                                                   "COMPLETED"]


def test_status_of_a_run_shows_every_job_and_attempt_on_one_clock(submitted_runs, tmp_path, capsys):
    resumed_run(submitted_runs["preempted-requeued"], tmp_path / "resumed")
    assert main(["status", "exp"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("run exp: jobs 101 COMPLETED, 104 COMPLETED; goodput=") and "s3://b/exp" in out[0]
    attempts = [line.split(":")[0].strip() for line in out if " attempt " in line and not line.startswith("run")]
    assert attempts == ["job 101 attempt 0", "job 101 attempt 1", "job 104 attempt 0"]
    assert out[-1].startswith("    time: lost 360s = queue 300s + start-up 60s + retrained 0s")
    assert main(["status", "exp", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert [(t["job_id"], t["job_attempt"], t["attempt"]) for t in run["attempt_times"]] == [
        ("101", 0, 0), ("101", 1, 1), ("104", 0, 2)]
    assert run["attempt_times"][2]["new_steps"] == 50 and run["goodput"]["wall_s"] == 2160.0


def test_runs_without_jobs_imports_no_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE.format(args=["runs"])], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env=os.environ | {"SLURM_TITAN_HOME": str(tmp_path)})
    assert result.stdout == "no jobs submitted from here yet\n"
    assert "HEAVY: \n" in result.stderr, result.stderr
