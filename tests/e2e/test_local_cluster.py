"""The bundled local Slurm cluster (tools/local-cluster): 5 nodes n1..n5 on one machine.

The session fixture (tests.support.cluster.cluster) brings the shared cluster up if it is not already healthy and
leaves it up. The lifecycle test uses a second, private cluster (own state dir and ports) so that it
never disturbs the shared one.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.support.cli import run, wait_for
from tests.support.cluster import TOOL
from tools.local_cluster.cluster import NODES, LocalCluster

pytestmark = pytest.mark.cluster

EVERY_NODE = f"-N{len(NODES)}"
SCRATCH = "/var/tmp/slurm-titan-local"


def job_fields(job_id: str, env: dict) -> dict:
    out = run(["scontrol", "-o", "show", "job", job_id], env=env, check=False).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def node_states(env: dict) -> dict:
    out = run(["sinfo", "-h", "-N", "-o", "%N %P %t"], env=env).stdout
    states: dict = {}
    for line in out.splitlines():
        node, part, state = line.split()
        states.setdefault(node, {})[part.rstrip("*")] = state
    return states


def test_sinfo_every_node_idle_in_low_and_high(slurm_env):
    def all_idle():
        states = node_states(slurm_env)
        return states if sorted(states) == list(NODES) and all(
            s == {"low": "idle", "high": "idle"} for s in states.values()
        ) else None

    wait_for(all_idle, 30, f"{len(NODES)} idle nodes in partitions low and high")
    default = run(["sinfo", "-h", "-o", "%P"], env=slurm_env).stdout.split()
    assert "low*" in default and "high" in default


def test_srun_runs_on_distinct_hostnames(slurm_env):
    out = run(["srun", EVERY_NODE, "-l", "hostname"], env=slurm_env).stdout
    by_rank = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert sorted(by_rank.values()) == list(NODES), out
    assert by_rank["0"] == "n1"


def test_node_local_scratch_differs_per_node_and_persists(slurm_env):
    tag = f"probe-{uuid.uuid4().hex[:8]}"
    write = (
        f'echo "$(hostname)" > {SCRATCH}/{tag}-$(hostname); '
        f'echo "$(hostname) $(ls {SCRATCH} | grep {tag} | tr "\\n" " ")"'
    )
    read = f'echo "$(hostname) $(cat {SCRATCH}/{tag}-* | tr "\\n" " ")"'
    try:
        out = run(
            ["srun", "-N2", "-w", "n1,n2", "--ntasks-per-node=1", "bash", "-c", write],
            env=slurm_env,
        ).stdout
        seen = {w[0]: w[1:] for w in map(str.split, out.strip().splitlines())}
        assert seen == {"n1": [f"{tag}-n1"], "n2": [f"{tag}-n2"]}, out
        # A later job on the same node finds the same files (a real local disk).
        out = run(
            ["srun", "-N2", "-w", "n1,n2", "--ntasks-per-node=1", "bash", "-c", read],
            env=slurm_env,
        ).stdout
        seen = {w[0]: w[1:] for w in map(str.split, out.strip().splitlines())}
        assert seen == {"n1": ["n1"], "n2": ["n2"]}, out
        # The login node's own directory is untouched.
        assert not list(Path(SCRATCH).glob(f"{tag}-*"))
    finally:
        run(["srun", EVERY_NODE, "bash", "-c", f"rm -f {SCRATCH}/{tag}-*"], env=slurm_env, check=False)


def test_node_names_resolve_inside_jobs(slurm_env):
    out = run(
        ["srun", "-N2", "-w", "n3,n4", "-l", "bash", "-c", "getent hosts n1 $(hostname)"],
        env=slurm_env,
    ).stdout
    assert re.search(r"^0: 127\.0\.0\.1\s+n1\b", out, re.M), out
    assert re.search(r"^1: 127\.0\.0\.1\s+n1\b", out, re.M), out
    # slurm.conf is also at the default path on the nodes (works without SLURM_CONF).
    out = run(
        ["srun", "-N1", "-w", "n2", "bash", "-c", "env -u SLURM_CONF scontrol show config | grep -c ClusterName"],
        env=slurm_env,
    ).stdout
    assert out.strip() == "1", out


def test_two_two_node_jobs_run_at_once(slurm_env, tmp_path):
    ids = [
        run(
            ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--chdir={tmp_path}",
             "-o", "/dev/null", "--wrap", "srun sleep 30"],
            env=slurm_env,
        ).stdout.strip()
        for _ in range(2)
    ]
    try:
        wait_for(
            lambda: all(job_fields(j, slurm_env).get("JobState") == "RUNNING" for j in ids),
            20, "both 2-node jobs RUNNING together",
        )
    finally:
        run(["scancel", *ids], env=slurm_env, check=False)


LOW_JOB = """#!/bin/bash
echo "START restart=${SLURM_RESTART_COUNT:-0}"
srun bash -c 'trap "echo GOT_USR2 \\$(hostname)" USR2; while true; do sleep 0.5; done'
"""


def test_high_partition_preempts_and_requeues_low_job(slurm_env, tmp_path):
    script = tmp_path / "low.sh"
    script.write_text(LOW_JOB)
    out = tmp_path / "low.out"
    low = run(
        ["sbatch", "--parsable", "-p", "low", EVERY_NODE, "--ntasks-per-node=1",
         "--signal=USR2@60", "--open-mode=append", f"--chdir={tmp_path}", "-o", out, script],
        env=slurm_env,
    ).stdout.strip()
    high = None
    try:
        wait_for(lambda: out.exists() and "START restart=0" in out.read_text(), 30,
                 "the low job to start")
        time.sleep(1)  # let every task install its trap
        high = run(
            ["sbatch", "--parsable", "-p", "high", "-N2", "--exclusive", f"--chdir={tmp_path}",
             "-o", tmp_path / "high.out", "--wrap", "hostname"],
            env=slurm_env,
        ).stdout.strip()
        # The victim's steps get --signal's USR2 at once (preempt_send_user_signal) ...
        wait_for(lambda: out.read_text().count("GOT_USR2") >= len(NODES), 15, "USR2 on every step")
        assert "DUE TO PREEMPTION" not in out.read_text()
        # ... and after GraceTime=20 the job is killed and requeued.
        wait_for(lambda: int(job_fields(low, slurm_env).get("Restarts", 0)) >= 1, 45,
                 "the low job to be requeued")
        assert job_fields(low, slurm_env)["JobState"] in {
            "COMPLETING", "PENDING", "REQUEUED", "RUNNING", "CONFIGURING"
        }
        wait_for(lambda: job_fields(high, slurm_env).get("JobState") == "COMPLETED", 30,
                 "the high job to run")
        text = out.read_text()
        assert "DUE TO PREEMPTION" in text
        assert sorted(re.findall(r"GOT_USR2 (n\d)", text)) == list(NODES)
    finally:
        run(["scancel", low] + ([high] if high else []), env=slurm_env, check=False)


def test_lifecycle_on_a_private_cluster(cluster, slurm_env):
    """up / idempotent up / stale restart / down / down, on its own state dir and ports."""
    # Not under tmp_path: munged wants every directory above its socket world-searchable.
    state = Path(f"/var/tmp/slurm-titan-test-{uuid.uuid4().hex[:8]}")
    env = dict(os.environ, SLURM_TITAN_CLUSTER_DIR=str(state), SLURM_TITAN_CLUSTER_PORT="17100")
    env.pop("SLURM_CONF", None)
    private = LocalCluster.from_env(env)
    try:
        up = run([TOOL, "up"], env=env, timeout=120)
        assert f"export SLURM_CONF={state / 'etc' / 'slurm.conf'}" in up.stdout.splitlines()
        cenv = env | private.env()
        assert cenv["SLURM_CONF"] == str(state / "etc" / "slurm.conf")
        assert run([TOOL, "status"], env=env).returncode == 0
        assert "already up" in run([TOOL, "up"], env=env).stderr
        assert run(["srun", EVERY_NODE, "hostname"], env=cenv).stdout.split().count("n1") == 1
        daemons = run(["pgrep", "-f", str(state)], env=env, check=False).stdout.split()
        assert len(daemons) == 2 + len(NODES)  # munged, slurmctld, a slurmd per node

        # A dead node makes the state stale: `up` cleans it and starts afresh.
        n3 = (state / "run" / "pids" / "slurmd-n3.pid").read_text().strip()
        run(["kill", "-KILL", n3])
        assert run([TOOL, "status"], env=env, check=False).returncode == 1
        assert "stale" in run([TOOL, "up"], env=env, timeout=120).stderr
        assert run([TOOL, "status"], env=env).returncode == 0
        ctld = (state / "run" / "pids" / "slurmctld.pid").read_text().strip()
        daemons = run(["pgrep", "-f", str(state)], check=False).stdout.split()
        daemons += run(["pgrep", "-P", ctld], check=False).stdout.split()  # slurmscriptd
        assert len(daemons) == 3 + len(NODES)
        run([TOOL, "down"], env=env, timeout=60)
        assert run(["pgrep", "-f", str(state)], check=False).stdout == ""
        for pid in daemons:  # gone, or a zombie waiting to be reaped
            stat = Path(f"/proc/{pid}/stat")
            assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
        assert str(state) not in run(["findmnt", "-rn", "-o", "TARGET,SOURCE"]).stdout
        assert sorted(p.name for p in state.iterdir()) == [".lock", "log"]
        assert run([TOOL, "down"], env=env).returncode == 0
        assert run([TOOL, "status"], env=env, check=False).returncode == 3
    finally:
        run([TOOL, "down"], env=env, timeout=60, check=False)
        shutil.rmtree(state, ignore_errors=True)
    # The shared cluster did not notice.
    assert cluster.status().code == 0


def test_missing_binary_is_named(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in ("/usr/bin", "/bin"):
        for p in Path(d).iterdir():
            if p.name != "sinfo" and not (bin_dir / p.name).exists():
                (bin_dir / p.name).symlink_to(p)
    p = run([TOOL, "up"], env=dict(os.environ, PATH=str(bin_dir)), check=False)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "sinfo" in lines[0], p.stderr
    assert "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge" in lines[0]
