"""The pure parts of tools/local-cluster: its config files, the command line, the state it reads back, the /proc
readers. Nothing here starts, stops or asks a cluster (tests/e2e/test_local_cluster.py does)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import wait_for
from tests.support.cluster import TOOL
from tools.local_cluster import cli, cpu_throttle, procs
from tools.local_cluster.cluster import (
    APT_LINE,
    ID_CYCLE,
    NODE_LIST,
    NODES,
    TEMPLATES,
    ClusterError,
    LocalCluster,
    first_job_id,
    missing_binary,
    node_resources,
    render,
    search_path,
)


def test_render_fills_every_placeholder_and_refuses_leftovers(tmp_path: Path) -> None:
    template = tmp_path / "x.tmpl"
    template.write_text("a=@A@ b=@B@ a again=@A@ & \\1\n\n\n")
    assert render(template, {"A": "1", "B": "two & \\2"}) == "a=1 b=two & \\2 a again=1 & \\1\n"
    with pytest.raises(ClusterError, match=rf"^unrendered placeholder in {template}: @B@$"):
        render(template, {"A": "1"})


def _rendered(state: Path, port: int) -> tuple[str, str]:
    cluster = LocalCluster(state, port)
    conf = render(TEMPLATES / "slurm.conf.tmpl", {
        "STATE": str(cluster.state), "CTLD_HOST": "login", "CTLD_PORT": str(port), "NODE_LIST": NODE_LIST,
        "NODE_PORTS": f"{port + 1}-{port + len(NODES)}", "NODE_CPUS": "2", "NODE_MEM": "4000",
        "MUNGE_SOCKET": str(cluster.munge_socket), "FIRST_JOB_ID": "42"})
    hosts = render(TEMPLATES / "hosts.tmpl", {"CTLD_HOST": "login", "NODE_NAMES": " ".join(NODES)})
    return conf, hosts


def test_the_rendered_slurm_conf_names_five_nodes_their_ports_and_the_private_munge(tmp_path: Path) -> None:
    conf, hosts = _rendered(tmp_path / "state", 17100)
    lines = conf.splitlines()
    assert NODE_LIST == "n[1-5]" and NODES == ("n1", "n2", "n3", "n4", "n5")
    assert "SlurmctldHost=login(127.0.0.1)" in lines and "SlurmctldPort=17100" in lines
    assert any(line.startswith("NodeName=n[1-5] NodeAddr=127.0.0.1 Port=[17101-17105] CPUs=2 ") and
               "RealMemory=4000" in line for line in lines)
    assert [line.split()[0:2] for line in lines if line.startswith("PartitionName=")] == [
        ["PartitionName=low", "Nodes=n[1-5]"], ["PartitionName=high", "Nodes=n[1-5]"]]
    assert f"AuthInfo=socket={tmp_path}/state/run/munge.socket,cred_expire=10" in lines
    assert f"SlurmdSpoolDir={tmp_path}/state/spool/%n" in lines and "FirstJobId=42" in lines
    assert "127.0.0.1\tn1 n2 n3 n4 n5 login" in hosts.splitlines()


@pytest.mark.parametrize(("cpus", "memory_kib", "advertised"), [
    (1, 2 * 1024 * 1024, (1, 1024)), (16, 128 * 1024 * 1024, (2, 4000)), (2, 6000 * 1024, (2, 3000))])
def test_nodes_advertise_no_more_than_the_machine_has(cpus: int, memory_kib: int, advertised: tuple) -> None:
    assert node_resources(cpus, memory_kib) == advertised


def test_a_missing_program_is_named_in_the_order_needed(tmp_path: Path) -> None:
    for name in ("slurmctld", "slurmd", "munged", "mungekey", "munge"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert missing_binary(str(tmp_path)) == "sinfo"
    assert search_path({"PATH": "/opt/bin"}) == "/opt/bin:/usr/sbin:/sbin"
    assert APT_LINE == "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"


def test_settings_come_from_the_environment_and_bad_numbers_are_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster.from_env({"SLURM_TITAN_CLUSTER_DIR": str(tmp_path), "SLURM_TITAN_CLUSTER_PORT": "17100",
                                     "PATH": "/bin"})
    assert (cluster.state, cluster.port, cluster.timeout_s) == (tmp_path, 17100, 60)
    assert cluster.path == "/bin:/usr/sbin:/sbin"
    assert cluster.env() == {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf", "SLURM_TITAN_CLUSTER_DIR": str(tmp_path)}
    assert cluster.export_lines() == (f"export SLURM_CONF={tmp_path}/etc/slurm.conf\n"
                                      f"export SLURM_TITAN_CLUSTER_DIR={tmp_path}")
    default = LocalCluster.from_env({"SLURM_TITAN_CLUSTER_DIR": "", "SLURM_TITAN_CLUSTER_PORT": ""})
    assert (str(default.state), default.port) == ("/var/tmp/slurm-titan-cluster", 17000)
    with pytest.raises(ClusterError, match=r"^SLURM_TITAN_CLUSTER_TIMEOUT must be a whole number, not '1m'$"):
        LocalCluster.from_env({"SLURM_TITAN_CLUSTER_TIMEOUT": "1m"})


def test_clusters_side_by_side_start_their_job_ids_a_quarter_of_an_id_cycle_apart() -> None:
    now = 1_764_650_000.0
    first = first_job_id(now, 0)
    assert first == int(now) % 10_000_000 + 1  # slot 0: the clock-derived id as before
    for slot in (1, 2, 3):  # master ports (job id % 10,000) stay apart
        assert (first_job_id(now + 30 * slot, slot) - first) % ID_CYCLE == slot * ID_CYCLE // 4 + 30 * slot
    assert LocalCluster.from_env({"SLURM_TITAN_CLUSTER_SLOT": "3"}).slot == 3
    with pytest.raises(ClusterError, match=r"^SLURM_TITAN_CLUSTER_SLOT must be below 4, not 4$"):
        LocalCluster.from_env({"SLURM_TITAN_CLUSTER_SLOT": "4"})


def test_a_cluster_never_brought_up_is_not_up(tmp_path: Path) -> None:
    status = LocalCluster(tmp_path / "none").status()
    assert (status.code, status.text) == (3, f"not up ({tmp_path}/none)")


def test_recorded_pids_count_only_while_they_run_the_same_program(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    pids = tmp_path / "run" / "pids"
    pids.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10  # Popen may return before exec renamed the child (/proc/PID/comm)
        while procs.program(sleeper.pid) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        (pids / "slurmd-n1.pid").write_text(f"{sleeper.pid}\n")  # another program under our pid
        (pids / "munged.pid").write_text("12x\n")
        assert cluster.pid_of("slurmd-n1") is None and cluster.pid_of("munged") is None
        assert cluster.pid_of("slurmctld") is None and not cluster.alive()
        assert procs.program(sleeper.pid) == "sleep" and procs.is_running(sleeper.pid)
        assert os.getpid() in procs.children(os.getppid()) and sleeper.pid in procs.children(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not procs.is_running(sleeper.pid) and procs.wait_gone([sleeper.pid], 1)


def test_a_nodes_namespaces_count_only_while_its_slurmd_runs_in_them(tmp_path: Path) -> None:
    """A killed node's namespace numbers are the kernel's to give again (another cluster's node may get them):
    its processes are the ones in its namespaces only while its own slurmd vouches for them."""
    cluster = LocalCluster(tmp_path)
    (tmp_path / "run" / "pids").mkdir(parents=True)
    (tmp_path / "run" / "ns").mkdir()
    ours = procs.namespaces(os.getpid())
    for node in ("n1", "n2"):  # as if we were nodes n1 and n2
        (tmp_path / "run" / "ns" / f"{node}.ns").write_text(f"{ours}\n")
    shutil.copy("/bin/sleep", tmp_path / "slurmd")
    slurmd = subprocess.Popen([tmp_path / "slurmd", "30"])
    try:
        deadline = time.monotonic() + 10
        while procs.program(slurmd.pid) != "slurmd" and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp_path / "run" / "pids" / "slurmd-n1.pid").write_text(f"{slurmd.pid}\n")  # n2's slurmd: gone
        assert cluster.node_namespaces() == {ours}
        assert slurmd.pid in cluster.node_processes("n1") and os.getpid() in cluster.node_processes("n1")
        assert cluster.node_processes("n2") == []
    finally:
        slurmd.kill()
        slurmd.wait()
    assert cluster.node_processes("n1") == []


def test_a_held_namespace_keeps_its_key_from_the_next_namespace_made() -> None:
    """The kernel gives a freed namespace's number to the next one made at once (another cluster's node, when
    the suite runs one cluster per worker): `down` holds the nodes' namespaces open while it kills and checks."""
    node = subprocess.Popen(["unshare", "--uts", "--mount", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while procs.program(node.pid) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        key = procs.namespaces(node.pid)
        with procs.namespaces_held([node.pid, 2**22 + 1]) as held:  # a pid that cannot exist: left out
            assert held == {key}
            node.kill()
            node.wait()
            made = subprocess.run(["unshare", "--uts", "--mount", "readlink", "/proc/self/ns/mnt",
                                   "/proc/self/ns/uts"], capture_output=True, text=True, check=True).stdout
            assert "/".join(made.split()) != key and procs.in_namespaces(held) == []
    finally:
        node.kill()
        node.wait()


def test_a_frozen_process_tree_is_ordered_children_first_and_killed_without_waking() -> None:
    """What kill_node does to a node: stop every process, then SIGKILL the deepest first."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (kids := procs.children(shell.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        sleeper = kids[0]
        assert procs.parent(sleeper) == shell.pid
        assert procs.children_first([shell.pid, sleeper]) == [sleeper, shell.pid]
        assert procs.send([shell.pid, sleeper], signal.SIGSTOP) == 2
        assert procs.wait_stopped([shell.pid, sleeper], 10)
        assert procs.state(shell.pid) == "T" and procs.state(sleeper) == "T"
        assert procs.send(procs.children_first([shell.pid, sleeper]), signal.SIGKILL) == 2
        assert procs.wait_gone([sleeper], 10)
    finally:
        shell.kill()
        shell.wait()
    assert shell.returncode == -signal.SIGKILL and procs.state(shell.pid) is None


def test_a_zombie_is_not_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert procs.wait_gone([child.pid], 30)  # exited, not reaped yet: a zombie
    assert procs.program(child.pid) is not None
    child.wait()


@pytest.mark.parametrize(("argv", "code"), [([], 2), (["bogus"], 2), (["up", "now"], 2), (["help"], 0), (["-h"], 0)])
def test_usage_on_help_and_on_anything_else(argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == code
    out, err = capsys.readouterr()
    usage = out if code == 0 else err
    assert usage.startswith("tools/local-cluster: a real multi-node Slurm cluster on this one machine.")
    assert all(f"tools/local-cluster {command}" in usage for command in cli.COMMANDS)


def test_env_of_a_cluster_never_up_warns_and_prints_the_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_TITAN_CLUSTER_DIR", str(tmp_path))
    assert cli.main(["env"]) == 0
    out, err = capsys.readouterr()
    assert out == f"export SLURM_CONF={tmp_path}/etc/slurm.conf\nexport SLURM_TITAN_CLUSTER_DIR={tmp_path}\n"
    assert err == f"local-cluster: warning: no cluster in {tmp_path} (run: tools/local-cluster up)\n"


def test_the_shim_runs_the_python_command_from_any_folder(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_TITAN_CLUSTER_DIR=str(tmp_path / "state"))
    status = subprocess.run([TOOL, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (status.returncode, status.stdout, status.stderr) == (3, f"not up ({tmp_path}/state)\n", "")
    bad = subprocess.run([TOOL, "nope"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("tools/local-cluster: a real multi-node Slurm cluster")


def test_a_training_process_is_signalled_once_its_log_shows_the_step_after_it_was_first_seen(tmp_path: Path) -> None:
    from tools.local_cluster.faults import SignalAtStep, step_reached

    log = tmp_path / "logs" / "rank-1.log"
    log.parent.mkdir()
    log.write_text("step:  3  loss: 7.0\n")  # before the process was seen: not counted
    job = f"test-{os.getpid()}"
    env = dict(os.environ, SLURM_JOB_ID=job, RANK="1")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slurm_titan.rank.entry"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slurm_titan.rank.entry"],
                             env=env | {"RANK": "0"})
    try:
        with SignalAtStep(tmp_path, job, {"RANK": "1"}, step_reached(3), poll_s=0.01) as fault:
            time.sleep(0.5)
            assert rank.poll() is None and not fault.signalled
            with log.open("a") as out:
                out.write("step:  3  loss: 6.9\n")
            assert rank.wait(10) == -signal.SIGKILL
        assert [env["RANK"] for env in fault.signalled] == ["1"] and other.poll() is None
    finally:
        for process in (rank, other):
            process.kill()
            process.wait()


@pytest.mark.skipif(cpu_throttle.root() is None, reason="needs a writable cgroup cpu controller (root)")
def test_a_paced_jobs_ranks_join_their_ranks_capped_group_once_they_log_a_step_and_leave_it_at_the_end(
        tmp_path: Path) -> None:
    from tools.local_cluster.faults import PacedRanks

    (tmp_path / "logs").mkdir()
    job = f"test-{os.getpid()}"
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "slurm_titan.rank.entry"]
    ranks = [subprocess.Popen(argv, env=dict(os.environ, SLURM_JOB_ID=job, RANK=str(r))) for r in (0, 1)]
    group = cpu_throttle.root() / f"slurm-titan-pace-{job}-0"
    try:
        with PacedRanks(tmp_path, job, 0.2) as pacer:
            time.sleep(0.6)
            assert not pacer.throttles  # started, no step yet: full speed
            (tmp_path / "logs" / "rank-0.log").write_text("step:  1  loss: 7.0\n")
            wait_for(lambda: group.is_dir() and (group / "cgroup.procs").read_text().split(), 10,
                     "rank 0 in its capped group", 0.05)
            assert pacer.throttles["0"].pids() == [ranks[0].pid] and "1" not in pacer.throttles
            assert pacer.throttles["0"].quota_us == 20_000  # 0.2 CPU of each 100 ms
        assert not group.exists() and ranks[0].poll() is None  # the group removed, its process left running
    finally:
        for process in ranks:
            process.kill()
            process.wait()
