"""The NPU node environment: variables from the config, CANN's and torch_npu's documented ranges, the per-node
CANN launcher."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from slurm_titan.errors import ConfigError, ExitCode
from slurm_titan.launch.config import WATCHDOG_MARGIN_S, JobConfig, load_config
from slurm_titan.launch.npu_env import (
    IF_BASE_PORTS,
    LINUX_EPHEMERAL,
    NpuSpec,
    alloc_conf_problem,
    cann_launcher,
    hccl_port_ranges,
    npu_variables,
    parse_affinity,
)
from slurm_titan.launch.plan import plan_job

BASE = """
name: npu-job
slurm: {nodes: 2, devices_per_node: 8}
environment:
  device: npu
  npu: {socket_ifname: [eth0]}
"""


def config_with(tmp_path: Path, *sets: tuple[str, object], text: str = BASE):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_config(path, list(sets))


def other_warnings(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr less the warning of a job without checkpoints (BASE has none; launch.config._check_watchdog)."""
    return "".join(line + "\n" for line in capsys.readouterr().err.splitlines() if "no progress watchdog" not in line)


DUMP = "/runs/npu-job/{job_id}/dump"


def rank_variables(config: JobConfig) -> dict[str, str]:
    return npu_variables(config.environment.npu, config.npu_job(), DUMP)


def test_variables_of_a_two_node_job(tmp_path: Path) -> None:
    assert rank_variables(config_with(tmp_path)) == {
        "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "HCCL_CONNECT_TIMEOUT": "1790",
        "HCCL_EXEC_TIMEOUT": "1910",
        "HCCL_HOST_SOCKET_PORT_RANGE": "61000-61127",
        "HCCL_NPU_SOCKET_PORT_RANGE": "61128-61255",
        "HCCL_IF_BASE_PORT": "61256",
        "HCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "2",
        "CPU_AFFINITY_CONF": "1",
        "STREAMS_PER_DEVICE": "32",
        "TORCH_HCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_HCCL_TRACE_BUFFER_SIZE": "20000",
        "TORCH_HCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_HCCL_ENABLE_MONITORING": "1",
        "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": f"{DUMP}/comm_traces/rank_",
    }


def test_torchtitan_comm_and_debug_options_reach_hccl(tmp_path: Path) -> None:
    config = config_with(tmp_path, ("torchtitan.args.comm.save_traces_folder", "fr"),
                         ("torchtitan.args.comm.save_traces_file_prefix", "r"),
                         ("torchtitan.args.debug.deterministic", True))
    variables = rank_variables(config)
    assert variables["TORCH_HCCL_DEBUG_INFO_TEMP_FILE"] == f"{DUMP}/fr/r"
    assert variables["HCCL_DETERMINISTIC"] == "true"
    off = rank_variables(config_with(tmp_path, ("torchtitan.args.comm.trace_buf_size", 0)))
    assert off["TORCH_HCCL_TRACE_BUFFER_SIZE"] == "0" and "TORCH_HCCL_DUMP_ON_TIMEOUT" not in off
    assert "HCCL_DETERMINISTIC" not in off


def test_timeouts_fire_in_order_from_one_section(tmp_path: Path) -> None:
    """torch's watchdog (torchtitan comm timeouts) before HCCL's device-side wait; connect = start-up budget."""
    config = config_with(tmp_path, ("timeouts.startup_s", 1500), ("timeouts.collective_s", 900))
    variables = rank_variables(config)
    assert variables["HCCL_CONNECT_TIMEOUT"] == "1500"
    assert int(variables["HCCL_EXEC_TIMEOUT"]) > max(1500, 900)
    argv = plan_job(config).node.rank_argv
    assert argv[argv.index("--comm.init-timeout-seconds") + 1] == "1500"
    assert argv[argv.index("--comm.train-timeout-seconds") + 1] == "900"


def process_group_timeout_s(timeout_s: int, exec_timeout_s: int) -> int:
    """Contract model of torch_npu 2.14.0's ProcessGroupHCCL (ProcessGroupHCCL.hpp DEFAULT_TIMEOUT = 30 min;
    ProcessGroupHCCL.cpp): a process group created with the default timeout takes it as unset and waits
    HCCL_EXEC_TIMEOUT + 1800 s instead, until torchtitan's first set_timeout."""
    return exec_timeout_s + 1800 if timeout_s == 1800 else timeout_s


def test_the_default_timeouts_fire_in_the_order_the_config_claims(tmp_path: Path) -> None:
    """config.TimeoutSpec: the progress watchdog, then torch's process-group watchdog, then HCCL_EXEC_TIMEOUT,
    at start-up (as torch_npu really sets the group's timeout) and after the first step."""
    config = config_with(tmp_path)
    execute = int(rank_variables(config)["HCCL_EXEC_TIMEOUT"])
    startup = process_group_timeout_s(config.timeouts.startup_s, execute)
    watchdog = config.watchdog
    assert max(watchdog.startup_s, watchdog.restore_s, watchdog.first_step_s) + WATCHDOG_MARGIN_S <= startup < execute
    assert max(watchdog.step_floor_s, watchdog.save_s) + WATCHDOG_MARGIN_S <= config.timeouts.collective_s < execute


def test_performance_settings_can_be_changed_or_left_unset(tmp_path: Path) -> None:
    config = config_with(tmp_path, ("environment.npu.task_queue", 1), ("environment.npu.cpu_affinity", None),
                         ("environment.npu.streams_per_device", 8), ("environment.npu.hccl_buffsize_mb", 400))
    variables = rank_variables(config)
    assert (variables["TASK_QUEUE_ENABLE"], variables["STREAMS_PER_DEVICE"], variables["HCCL_BUFFSIZE"]) == \
        ("1", "8", "400")
    assert "CPU_AFFINITY_CONF" not in variables


def test_cpu_affinity_grammar() -> None:
    affinity = parse_affinity("1,npu0:0-3,npu1:8-9,npu_affine:1")
    assert affinity.mode == 1 and affinity.ranges == {0: frozenset(range(4)), 1: frozenset({8, 9})}
    assert affinity.force is None and parse_affinity("0").ranges == {}
    repeated = parse_affinity("2,npu0:0-3,npu1:4-5,npu0:10-11,force:1")  # CPU_AFFINITY_CONF.md: ranges may repeat
    assert repeated.ranges == {0: frozenset({0, 1, 2, 3, 10, 11}), 1: frozenset({4, 5})} and repeated.force is True
    assert parse_affinity("1,force:0").force is False
    with pytest.raises(ValueError, match="'force:2' is not"):
        parse_affinity("1,force:2")


@pytest.mark.parametrize(("cpus_per_node", "affinity", "wanted"), [
    (64, "1", "1,force:1"),  # the task runs on 64 CPUs: torch_npu would skip the binding ("already set")
    (64, "2,npu0:0-29,npu1:30-59", "2,npu0:0-29,npu1:30-59,force:1"),
    (64, "1,force:0", "1,force:0"),  # the config's own choice
    (64, "0", "0"),
    (None, "1", "1"),
])
def test_binding_is_forced_when_slurm_narrows_the_cpus(tmp_path: Path, cpus_per_node: int | None, affinity: str,
                                                       wanted: str) -> None:
    sets = [("slurm.devices_per_node", 2), ("environment.npu.cpu_affinity", affinity)]
    sets += [("slurm.cpus_per_node", cpus_per_node)] if cpus_per_node else []
    assert rank_variables(config_with(tmp_path, *sets))["CPU_AFFINITY_CONF"] == wanted


@pytest.mark.parametrize(
    ("affinity", "upload", "message"),
    [
        ("1", "60-63", "binds device 0 to its share of all cores"),
        ("1,npu0:0-29", "60-63", "binds device 1 to its share"),
        ("2,npu0:0-29,npu1:30-61", "60-63", "CPU 60 is also in device 1's range"),
        ("1,npu0:60-63,npu0:0-29,npu1:30-59", "60-63", "CPU 60 is also in device 0's range"),
    ],
)
def test_upload_cpus_outside_the_bound_cores(tmp_path: Path, affinity: str, upload: str, message: str) -> None:
    sets = [("slurm.devices_per_node", 2), ("environment.npu.cpu_affinity", affinity),
            ("checkpoint.enable", True), ("checkpoint.upload_cpus", upload)]
    with pytest.raises(ConfigError) as caught:
        config_with(tmp_path, *sets)
    assert caught.value.key == "checkpoint.upload_cpus" and message in caught.value.problem
    sets[1] = ("environment.npu.cpu_affinity", "1,npu0:0-29,npu1:30-59,force:1")
    config_with(tmp_path, *sets)
    sets[1] = ("environment.npu.cpu_affinity", "0")
    config_with(tmp_path, *sets)


def test_explicit_devices_address_and_no_alloc_conf(tmp_path: Path) -> None:
    config = config_with(tmp_path, ("slurm.nodes", 1), ("slurm.devices_per_node", 4),
                         ("environment.npu.socket_ifname", []), ("environment.npu.if_ip", "10.0.0.5"),
                         ("environment.npu.visible_devices", [4, 5, 6, 7]), ("environment.npu.alloc_conf", None))
    variables = rank_variables(config)
    assert variables["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert variables["HCCL_IF_IP"] == "10.0.0.5"
    assert "HCCL_SOCKET_IFNAME" not in variables and "PYTORCH_NPU_ALLOC_CONF" not in variables


@pytest.mark.parametrize("devices", [1, 8, 16])
def test_port_ranges_fit_the_node_and_avoid_master_window_and_ephemeral(devices: int) -> None:
    host, npu, root = hccl_port_ranges(NpuSpec(), devices, (20000, 29999))
    assert host.high - host.low + 1 == devices * 16 == npu.high - npu.low + 1
    assert root.high - root.low + 1 == IF_BASE_PORTS
    assert host.high < npu.low and npu.high < root.low and root.high <= 65535
    for low, high in ((20000, 29999), LINUX_EPHEMERAL, (60000, 60031)):  # 60000-60031: HCCL_IF_BASE_PORT's default
        assert not any(block.overlaps(low, high) for block in (host, npu, root))


def test_port_ranges_move_past_a_window_above_the_ephemeral_range() -> None:
    host, npu, root = hccl_port_ranges(NpuSpec(), 8, (61000, 62000))
    assert (host.low, npu.high, root.low, root.high) == (62001, 62256, 62257, 62288)


def test_a_pinned_if_base_port_moves_the_socket_ports_out_of_its_way() -> None:
    host, npu, root = hccl_port_ranges(NpuSpec(if_base_port=61100), 8, (20000, 29999))
    assert (root.low, root.high) == (61100, 61131)
    assert not host.overlaps(root.low, root.high) and not npu.overlaps(root.low, root.high)


@pytest.mark.parametrize(
    ("sets", "key", "message"),
    [
        ([("timeouts.startup_s", 60)], "timeouts.startup_s",
         "HCCL_CONNECT_TIMEOUT must be within 120..7200 (CANN), got 60"),
        ([("timeouts.startup_s", 7201)], "timeouts.startup_s", "HCCL_CONNECT_TIMEOUT must be within 120..7200"),
        ([("environment.env.HCCL_OP_EXPANSION_MODE", "AIV")], "timeouts.collective_s",
         "HCCL_OP_EXPANSION_MODE=AIV caps HCCL_EXEC_TIMEOUT at 1091 s"),
        ([("environment.npu.connect_timeout_s", 600)], "environment.npu.connect_timeout_s",
         "moved: set timeouts.startup_s"),
        ([("environment.npu.exec_timeout_s", 1836)], "environment.npu.exec_timeout_s",
         "moved: set timeouts.collective_s"),
        ([("environment.npu.if_base_port", 60000)], "environment.npu.if_base_port",
         "HCCL_IF_BASE_PORT: ports 60000-60031 overlap the kernel's ephemeral range"),
        ([("environment.npu.if_base_port", 25000)], "environment.npu.if_base_port", "slurm.port_window"),
        ([("environment.npu.if_base_port", 61000), ("environment.npu.port_base", 61000)],
         "environment.npu.port_base", "overlap environment.npu.if_base_port 61000-61031"),
        ([("environment.npu.task_queue", 3)], "environment.npu.task_queue", "TASK_QUEUE_ENABLE must be 0, 1 or 2"),
        ([("environment.npu.streams_per_device", 16)], "environment.npu.streams_per_device",
         "STREAMS_PER_DEVICE must be 8 or 32"),
        ([("environment.npu.cpu_affinity", "3")], "environment.npu.cpu_affinity", "mode '3' must be 0, 1 or 2"),
        ([("environment.npu.cpu_affinity", "1,npu0:5-2")], "environment.npu.cpu_affinity",
         "'npu0:5-2' is not npu<device>:<first>-<last>"),
        ([("environment.npu.hccl_buffsize_mb", 0)], "environment.npu.hccl_buffsize_mb", "HCCL_BUFFSIZE must be >= 1"),
        ([("environment.npu.multi_stream_memory_reserve", 1)], "environment.npu.multi_stream_memory_reserve",
         "removed: torch_npu 2.14.0 does not read MULTI_STREAM_MEMORY_RESERVE"),
        ([("timeouts.startup_s", 1800)], "timeouts.startup_s",
         "1800 s is ProcessGroupHCCL's default timeout, which torch_npu replaces with HCCL_EXEC_TIMEOUT + 1800 s "
         "(3720 s)"),
        ([("environment.env.HCCL_ASYNC_ERROR_HANDLING", "0")], "environment.env.HCCL_ASYNC_ERROR_HANDLING",
         "comes from environment.npu"),
        ([("environment.env.TASK_QUEUE_ENABLE", "1")], "environment.env.TASK_QUEUE_ENABLE",
         "comes from environment.npu"),
        ([("environment.npu.visible_devices", [0, 1])], "environment.npu.visible_devices",
         "lists 2 devices but slurm.devices_per_node is 8"),
        ([("environment.npu.visible_devices", [7, 6, 5, 4, 3, 2, 1, 0])], "environment.npu.visible_devices",
         "ascending order"),
        ([("environment.npu.socket_ifname", ["eth 0"])], "environment.npu.socket_ifname",
         "'eth 0' is not a network interface name"),
        ([("environment.npu.if_ip", "10.0.0.5"), ("environment.npu.socket_ifname", [])], "environment.npu.if_ip",
         "HCCL_IF_IP is one node's address"),
        ([("slurm.nodes", 1), ("environment.npu.if_ip", "10.0.0.300")], "environment.npu.if_ip",
         "is not an IP address"),
        ([("environment.npu.port_base", 25000)], "environment.npu.port_base",
         "ports 25000-25287 overlap slurm.port_window 20000-29999"),
        ([("environment.npu.port_base", 40000)], "environment.npu.port_base", "the kernel's ephemeral range"),
        ([("environment.npu.port_base", 65500)], "environment.npu.port_base", "leave 1024-65535"),
        ([("environment.npu.ports_per_device", 4000)], "environment.npu.port_base", "no room for 64000 HCCL ports"),
        ([("environment.npu.ports_per_device", 0)], "environment.npu.ports_per_device", "must be >= 1"),
        ([("environment.npu.alloc_conf", "expandable_segment:True")], "environment.npu.alloc_conf",
         "'expandable_segment:True' is not option:value"),
        ([("environment.env.HCCL_CONNECT_TIMEOUT", "300")], "environment.env.HCCL_CONNECT_TIMEOUT",
         "comes from environment.npu"),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, sets: list, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with(tmp_path, *sets)
    assert caught.value.key == key
    assert message in caught.value.problem


def test_other_devices_ignore_the_npu_section(tmp_path: Path) -> None:
    config = config_with(tmp_path, ("environment.device", "cpu"), ("environment.npu.task_queue", 7))
    assert config.environment.npu.task_queue == 7


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("expandable_segments:True,base_addr_aligned_kb:16", None),
        ("max_split_size_mb:32,garbage_collection_threshold:0.6", None),
        ("max_split_size_mb:20", "max_split_size_mb must be an integer > 20, got '20'"),
        ("garbage_collection_threshold:1.0", "garbage_collection_threshold must be a number in (0, 1)"),
        ("expandable_segments:true", "expandable_segments must be True or False"),
        ("expandable_segments:True,max_split_size_mb:64", "need expandable_segments:False"),
        ("page_size:1g,segment_size_mb:40", None),
    ],
)
def test_alloc_conf_follows_torch_npu_documentation(text: str, problem: str | None) -> None:
    found = alloc_conf_problem(text)
    assert found == problem if problem is None else problem in found


def run_setup(spec: NpuSpec, tmp_path: Path, node: str = "n7") -> subprocess.CompletedProcess:
    """The launcher as srun runs it on node `node` (a `hostname` of its own on PATH), starting a command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho {node}\n")
    (bin_dir / "hostname").chmod(0o755)
    command = 'echo "home=$ASCEND_HOME_PATH atb=${ATB_HOME_PATH:-none} args=$*"'
    line = f"{cann_launcher(spec)} bash -c {shlex.quote(command)} cmd -u -m x"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=tmp_path, timeout=30,
                          check=False, env=env)


def test_missing_cann_stops_the_job_with_a_clear_message(tmp_path: Path) -> None:
    done = run_setup(NpuSpec(ascend_home=str(tmp_path / "Ascend")), tmp_path, node="n7")
    assert done.returncode == ExitCode.PREFLIGHT
    assert "CANN not found on n7:" in done.stderr and f"{tmp_path}/Ascend/ascend-toolkit/set_env.sh" in done.stderr
    assert "home=" not in done.stdout  # the node's command never starts


def test_set_env_and_atb_are_sourced(tmp_path: Path) -> None:
    home = tmp_path / "Ascend"
    (home / "cann").mkdir(parents=True)
    (home / "cann/set_env.sh").write_text(f"export ASCEND_HOME_PATH={home}/cann\n")
    (home / "nnal/atb").mkdir(parents=True)
    (home / "nnal/atb/set_env.sh").write_text("export ATB_HOME_PATH=/atb\n")
    done = run_setup(NpuSpec(ascend_home=str(home)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"home={home}/cann atb=/atb args=-u -m x"


def test_a_node_with_both_cann_layouts_sources_the_newest(tmp_path: Path) -> None:
    home = tmp_path / "Ascend"
    for layout in ("cann", "ascend-toolkit"):
        (home / layout).mkdir(parents=True)
        (home / layout / "set_env.sh").write_text(f"export ASCEND_HOME_PATH={home}/{layout}\n")
    done = run_setup(NpuSpec(ascend_home=str(home)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"home={home}/cann ")


def test_a_set_env_that_sets_nothing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.sh").write_text("true\n")
    done = run_setup(NpuSpec(set_env=str(tmp_path / "broken.sh")), tmp_path, node="n3")
    assert done.returncode == ExitCode.PREFLIGHT
    assert "did not set ASCEND_HOME_PATH on n3" in done.stderr


def test_every_node_sources_cann_in_its_own_task_and_cpu_jobs_stay_clean(tmp_path: Path) -> None:
    plan = plan_job(config_with(tmp_path))
    setup = plan.parameters["setup"]
    assert not any("set_env" in line for line in setup)  # the batch host's set-up runs once, before srun
    assert "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in setup
    srun = plan.script().split("\nsrun ", 1)[1]
    assert srun.index("$hold_stop_signals bash -c ") < srun.index("slurm-titan-cann /") < srun.index("submitit")
    assert plan.submitit_command.startswith(plan.launcher) and "exec \"$@\"" in plan.launcher
    trace = next(line for line in setup if line.startswith("export TORCH_HCCL_DEBUG_INFO_TEMP_FILE="))
    assert trace.endswith('/npu-job/"$SLURM_JOB_ID"/dump/comm_traces/rank_')
    cpu = plan_job(config_with(tmp_path, ("environment.device", "cpu")))
    assert not any("HCCL" in line or "set_env" in line for line in cpu.parameters["setup"])
    assert "bash -c" not in cpu.launcher


def test_managed_variables_of_the_submitting_shell_never_reach_the_ranks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """sbatch exports the submitting shell's environment: the batch script's own lines, run in a shell that has
    PYTORCH_ALLOC_CONF (torch_npu stops every rank on it next to PYTORCH_NPU_ALLOC_CONF) and a
    CPU_AFFINITY_CONF the config leaves unset, pass neither on to srun; one warning names them at submit."""
    shell = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "CPU_AFFINITY_CONF": "2", "PATH": "/usr/bin:/bin"}
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    plan = plan_job(config_with(tmp_path, ("environment.npu.cpu_affinity", None),
                                ("environment.setup", ["export PYTORCH_ALLOC_CONF=from-a-setup-line"])))
    warning = other_warnings(capsys)
    assert warning.count("\n") == 1 and "PYTORCH_ALLOC_CONF" in warning and "CPU_AFFINITY_CONF" in warning
    setup = plan.parameters["setup"]
    batch_lines = setup[setup.index("export PYTORCH_ALLOC_CONF=from-a-setup-line"):]
    lines = [line for line in batch_lines if line.startswith(("export ", "unset "))]
    done = subprocess.run(["bash", "-c", "\n".join([*lines, "env"])], capture_output=True, text=True, env=shell,
                          timeout=30, check=True)
    rank_env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert rank_env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in rank_env and "CPU_AFFINITY_CONF" not in rank_env
    with pytest.raises(ConfigError, match="environment.env.PYTORCH_ALLOC_CONF: comes from environment.npu"):
        config_with(tmp_path, ("environment.env.PYTORCH_ALLOC_CONF", "expandable_segments:True"))
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    monkeypatch.delenv("CPU_AFFINITY_CONF")
    plan_job(config_with(tmp_path))
    assert other_warnings(capsys) == ""


def test_the_preflight_checks_the_root_info_ports_against_each_node(tmp_path: Path) -> None:
    """HCCL_IF_BASE_PORT's block travels in the preflight expectations, so the doctor's ephemeral-port check
    flags a node whose ip_local_port_range reaches it."""
    from slurm_titan.doctor.checks import node_findings
    from slurm_titan.doctor.facts import NodeFacts

    expect = plan_job(config_with(tmp_path)).node.preflight
    assert expect is not None and (61256, 61287) in expect.hccl_port_ranges
    facts = NodeFacts(0, "n1", "npu", {"torch_npu": "2.14.0"}, ephemeral_range=(61260, 61300))
    assert [f.found for f in node_findings(facts, expect) if f.check == "HCCL ports"] == [
        "61256-61287 overlaps this node's ephemeral ports 61260-61300 (61260-61287 not reserved)"]
