"""A USR2 that comes while a node's supervisor is still starting waits for its handler.

The batch script's own lines (the hold from the node set-up, the srun command's launcher) start
a Python that announces itself, gets Slurm's USR2 before it has any handler, and only then calls
`take_stop_signals`, as the supervisor does after submitit's start-up.
"""

import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import HOLD_SIGNALS_VAR, plan_job
from tests.support.plans import pinned_debug_cpu

SUPERVISOR_START = textwrap.dedent("""
    import sys
    print("started", flush=True)
    sys.stdin.readline()  # the test has sent USR2 by now
    from slurm_titan.signals import take_stop_signals
    got = []
    take_stop_signals(lambda signum, frame: got.append(signum))
    print("handled", got, flush=True)
""")


def start_supervisor_like(hold_lines: list[str]) -> subprocess.CompletedProcess:
    launcher = f"${HOLD_SIGNALS_VAR} {sys.executable}"
    script = "\n".join([*hold_lines, f"exec {launcher} -c {shlex.quote(SUPERVISOR_START)}"])
    process = subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "started\n"
    process.send_signal(signal.SIGUSR2)
    out, _ = process.communicate("go\n", timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out)


def test_usr2_during_start_up_waits_for_the_supervisor(tmp_path: Path) -> None:
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path)))
    assert plan.submitit_command.startswith(plan.launcher)
    hold = [line for line in plan.parameters["setup"] if line.startswith(f"export {HOLD_SIGNALS_VAR}=")
            or line.startswith(f"${HOLD_SIGNALS_VAR} ")]
    assert len(hold) == 2, plan.parameters["setup"]
    done = start_supervisor_like(hold)
    assert done.returncode == 0 and done.stdout == f"handled [{int(signal.SIGUSR2)}]\n"


def test_without_the_hold_the_same_signal_kills_it() -> None:
    assert start_supervisor_like([]).returncode == -signal.SIGUSR2
