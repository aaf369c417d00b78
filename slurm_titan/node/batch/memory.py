"""The batch shell's part of the RAM tier: an allocation that ends after a failure (the job failed, was requeued, or
finished on other nodes than a failed attempt's) may leave snapshots in the memory of nodes whose supervisors kept
them for a restart; one srun step removes them.

(A job that ran one attempt to its end or stopped for a preemption has none left: each supervisor removed its own. A
job killed outright, its batch shell with it, leaves them to the node's own cleanup: Slurm's job_container/tmpfs, or
the epilog.)
"""

from __future__ import annotations

import subprocess

from slurm_titan.node.node_log import say
from slurm_titan.ram import layout

CLEAR_TIMEOUT_S = 120.0


def clear_command(root: str, hosts: list[str]) -> list[str]:
    """One task on each of `hosts` that removes `root`."""
    return ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}", "--kill-on-bad-exit=0", "rm", "-rf", root]


def clear(memory_dir: str, job_id: str, requeue: int, hosts: list[str], timeout_s: float = CLEAR_TIMEOUT_S) -> None:
    """Remove the job's snapshot folder from the memory of `hosts` (its healthy nodes); a failure is said, never
    raised: the job's verdict stands."""
    if not hosts:
        return
    root = str(layout.job_root(memory_dir, job_id, requeue))
    try:
        done = subprocess.run(clear_command(root, hosts), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        say(f"WARNING: the RAM tier's snapshots ({root}) may be left on {','.join(hosts)}: {error}")
        return
    if done.returncode != 0:
        say(f"WARNING: the RAM tier's snapshots ({root}) may be left on {','.join(hosts)}: srun exited with "
            f"{done.returncode}: {done.stderr.strip()[-300:]}")
    else:
        say(f"RAM tier: removed the job's snapshots from the memory of {','.join(hosts)}")
