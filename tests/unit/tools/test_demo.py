"""tools/demo's submit step, run on its own with stdout and stderr redirected to one log file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.paths import REPO


def _submit_snippet() -> str:
    """The `submit() { ... }` function of tools/demo, as written there."""
    found = re.search(r"^submit\(\) \{\n.*?^\}\n", (REPO / "tools" / "demo").read_text(), re.S | re.M)
    assert found, "tools/demo has no submit() function"
    return found.group(0)


def test_demo_log_keeps_what_was_printed_before_the_submit(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    script = "\n".join([
        "set -euo pipefail",
        "echo 'PARTITION AVAIL  NODES (sinfo, printed before the submit)'",
        "st() { echo \"submitted job 77 (debug-cpu, $# arg(s))\"; echo 'logs: /runs/debug-cpu/77'; }",
        _submit_snippet(),
        "submit configs/debug_cpu.yaml --nodes 2",
        "echo \"following job $job\"",
    ])
    with log.open("w") as out:
        subprocess.run(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, check=True, timeout=30)
    assert log.read_text() == ("PARTITION AVAIL  NODES (sinfo, printed before the submit)\n"
                               "submitted job 77 (debug-cpu, 4 arg(s))\nlogs: /runs/debug-cpu/77\n"
                               "following job 77\n")


def test_demo_stops_when_the_submit_fails(tmp_path: Path) -> None:
    script = "\n".join(["set -euo pipefail", "st() { echo 'slurm-titan: bad config' >&2; return 2; }",
                        _submit_snippet(), "submit configs/x.yaml", "echo 'not reached'"])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == "" and result.stderr == "slurm-titan: bad config\n"
