"""Whether nodes of the job still answer: a one-task probe step on each (used by the batch shell's step watcher and
finish, and by a supervisor that checks the batch host)."""

from __future__ import annotations

import subprocess
import time

PROBE_TIMEOUT_S = 30.0


def probe_failures(hosts: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> set[str]:
    """Those of `hosts` on which a one-task probe step (`srun true`, all at once) does not succeed within
    `timeout_s`: a node that died is found before slurmctld's SlurmdTimeout marks it down."""
    bad: set[str] = set()
    probes = {host: subprocess.Popen(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                                      "--quit-on-interrupt", "true"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for host in hosts}
    deadline = time.monotonic() + timeout_s
    for host, probe in probes.items():
        try:
            if probe.wait(max(0.0, deadline - time.monotonic())) != 0:
                bad.add(host)
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
            bad.add(host)
    return bad
