"""Which nodes of the allocation train the next attempt, and its number (runs in the batch shell).

The job allocates `slurm.nodes + slurm.spare_nodes` nodes with `sbatch --no-kill`, so the
allocation outlives a dead node. Each attempt is one srun step on `slurm.nodes` of them (node.batch_spec): the first
healthy ones (Slurm answers for them) that this run has not excluded. The batch set-up runs
`python -m slurm_titan.node.batch.allocation` and evals what it prints; `finish` calls `next_attempt`
again before a restart inside the allocation. The srun line reads the choice from
envvars.NODES / envvars.NUM_NODES; the node supervisors from envvars.NODES and envvars.ATTEMPT_INDEX.

Attempts are numbered across restarts inside the allocation and requeues alike: the next number is
one past the highest `attempts/<A>/` folder of the job, which this module creates.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_titan import envvars, slurm
from slurm_titan.errors import ClusterError
from slurm_titan.hostlist import expand_hostlist
from slurm_titan.node.batch_spec import load_or_exit
from slurm_titan.records import run_folder
from slurm_titan.records.whole_file import replace_text

_UNHEALTHY = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT")


@dataclass(frozen=True)
class AttemptPlan:
    """One attempt's number and nodes (node rank = position in `nodes`)."""

    attempt: int
    nodes: tuple[str, ...]

    def env(self) -> dict[str, str]:
        return {envvars.ATTEMPT_INDEX: str(self.attempt), envvars.NODES: ",".join(self.nodes),
                envvars.NUM_NODES: str(len(self.nodes))}


def read_excluded(job_dir: Path) -> dict[str, str]:
    """Nodes this run left out, with why; an unreadable file is one warning and counts as empty."""
    path = run_folder.excluded_nodes_file(job_dir)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {str(host): str(why) for host, why in data.items()}
    except (OSError, ValueError, AttributeError) as error:
        print(f"slurm-titan: WARNING: {path} is unreadable ({error}); no node is excluded", file=sys.stderr)
        return {}


def exclude(job_dir: Path, host: str, why: str) -> dict[str, str]:
    """Add `host` to the run's excluded nodes (written whole, atomically); returns them all."""
    excluded = read_excluded(job_dir) | {host: why}
    replace_text(run_folder.excluded_nodes_file(job_dir), json.dumps(excluded, indent=1, sort_keys=True))
    return excluded


def unhealthy_nodes(hosts: list[str]) -> set[str]:
    """Those of `hosts` that Slurm reports down, drained, failing or not responding (one scontrol call)."""
    result = slurm.run(["scontrol", "show", "node", "-o", ",".join(hosts)], check=False)
    bad = set()
    for line in result.stdout.splitlines():
        fields = slurm.parse_key_values(line)
        if any(flag in fields.get("State", "") for flag in _UNHEALTHY):
            bad.add(fields.get("NodeName", ""))
    return bad


def choose_nodes(allocated: list[str], wanted: int, unhealthy: set[str], excluded: set[str]) -> list[str]:
    """The first `wanted` allocated nodes that are healthy and not excluded (fewer if there are not enough)."""
    return [host for host in allocated if host not in unhealthy and host not in excluded][:wanted]


def next_attempt_number(job_dir: Path) -> int:
    """Create and return the next free `attempts/<A>` number (the batch shell's two processes may claim at once: the
    first attempt's step watcher and `finish`, node.batch.ahead)."""
    while True:
        number = max(run_folder.attempt_numbers(job_dir), default=-1) + 1
        try:
            run_folder.attempt_folder(job_dir, number).mkdir(parents=True)
            return number
        except FileExistsError:
            continue


def next_attempt(job_dir: Path, wanted: int, env: Mapping[str, str] | None = None,
                 number: int | None = None) -> AttemptPlan | None:
    """The next attempt on this allocation (numbered `number` when it is claimed already: node.batch.ahead), or None
    when too few healthy, non-excluded nodes are left."""
    env = os.environ if env is None else env
    allocated = expand_hostlist(env["SLURM_JOB_NODELIST"])
    try:
        unhealthy = unhealthy_nodes(allocated)
    except ClusterError as error:  # slurmctld busy: trust the allocation
        print(f"slurm-titan: WARNING: node states unknown ({error})", file=sys.stderr)
        unhealthy = set()
    nodes = choose_nodes(allocated, wanted, unhealthy, set(read_excluded(job_dir)))
    if len(nodes) < wanted:
        return None
    return AttemptPlan(next_attempt_number(job_dir) if number is None else number, tuple(nodes))


def main(argv: list[str] | None = None) -> int:
    """Print the first attempt's `export` lines for the batch set-up to eval."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", type=Path, required=True)
    job_dir = parser.parse_args(argv).job_dir
    nodes = load_or_exit(job_dir).nodes
    plan = next_attempt(job_dir, nodes)
    if plan is None:  # a requeue landed on excluded nodes: train on them rather than not at all
        allocated = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
        print(f"slurm-titan: WARNING: fewer than {nodes} healthy nodes not excluded by this run in "
              f"{','.join(allocated)}; using the allocation's first {nodes}", file=sys.stderr)
        plan = AttemptPlan(next_attempt_number(job_dir), tuple(allocated[:nodes]))
    print("\n".join(f"export {name}={shlex.quote(value)}" for name, value in plan.env().items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
