"""Whether nodes of the job still answer: one probe step over all of them (used by the batch shell's step watcher
and finish, and by a supervisor that checks the batch host).

One round is one `srun` whatever the node count (not one per node: at 512 nodes that was 511 sruns a round), and a
node is judged only once the step exists: slurmctld may take long to create a step when it is busy, and a node whose
task was never launched has not failed to answer.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterable

PROBE_TIMEOUT_S = 30.0
"""How long the nodes have to start their task once the step is created."""
STEP_CREATION_S = 300.0
"""How long slurmctld may take to create the probe step; nobody is judged before (then every node is judged)."""
ANSWER = "slurm-titan-probe "
_LAUNCHING = re.compile(r"srun: launching StepId=")  # srun -v: the step exists, its tasks are being launched


def probe_command(hosts: list[str]) -> list[str]:
    """One task on each of `hosts`, which prints its node's name; srun's `-v` says when the step is created."""
    return ["srun", "-v", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}", "--overlap", "--quit-on-interrupt", "--kill-on-bad-exit=0",
            "sh", "-c", f'echo "{ANSWER}$SLURMD_NODENAME"']


class _Round:
    """What one probe step's output says so far: whether the step exists, which nodes answered."""

    def __init__(self) -> None:
        self.created: float | None = None
        self.answered: set[str] = set()
        self.changed = threading.Condition()

    def read(self, lines: Iterable[str]) -> None:
        for line in lines:
            with self.changed:
                if line.startswith(ANSWER):
                    self.answered.add(line[len(ANSWER):].strip())
                elif self.created is None and _LAUNCHING.search(line):
                    self.created = time.monotonic()
                self.changed.notify_all()


def probe_failures(hosts: list[str], timeout_s: float = PROBE_TIMEOUT_S,
                   creation_s: float = STEP_CREATION_S) -> set[str]:
    """Those of `hosts` whose probe task does not start within `timeout_s` of the probe step's creation (or,
    should srun never say the step was created, within `creation_s`): a node that died is found before
    slurmctld's SlurmdTimeout marks it down."""
    if not hosts:
        return set()
    wanted = set(hosts)
    probe = subprocess.Popen(probe_command(sorted(wanted)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, errors="replace")
    assert probe.stdout is not None
    seen = _Round()
    reader = threading.Thread(target=seen.read, args=(probe.stdout,), name="srun-probe", daemon=True)
    reader.start()
    started = time.monotonic()
    with seen.changed:
        while not wanted <= seen.answered and reader.is_alive():
            deadline = seen.created + timeout_s if seen.created is not None else started + creation_s
            if time.monotonic() >= deadline:
                break
            seen.changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
    if probe.poll() is None:
        probe.kill()
    probe.wait()
    reader.join(timeout=5)
    with seen.changed:
        return wanted - seen.answered
