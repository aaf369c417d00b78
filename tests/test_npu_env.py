"""The NPU node environment: variables from the config, CANN's documented ranges, the set-up shell lines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_titan.config import load_config
from slurm_titan.errors import ConfigError
from slurm_titan.npu_env import (
    LINUX_EPHEMERAL,
    PREFLIGHT_EXIT_CODE,
    NpuSpec,
    alloc_conf_problem,
    hccl_port_ranges,
    npu_setup_lines,
    npu_variables,
)
from slurm_titan.plan import plan_job

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


def test_variables_of_a_two_node_job(tmp_path: Path) -> None:
    assert npu_variables(config_with(tmp_path)) == {
        "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_EXEC_TIMEOUT": "1836",
        "HCCL_HOST_SOCKET_PORT_RANGE": "61000-61127",
        "HCCL_NPU_SOCKET_PORT_RANGE": "61128-61255",
        "HCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    }


def test_explicit_devices_address_and_no_alloc_conf(tmp_path: Path) -> None:
    config = config_with(tmp_path, ("slurm.nodes", 1), ("slurm.devices_per_node", 4),
                         ("environment.npu.socket_ifname", []), ("environment.npu.if_ip", "10.0.0.5"),
                         ("environment.npu.visible_devices", [4, 5, 6, 7]), ("environment.npu.alloc_conf", None))
    variables = npu_variables(config)
    assert variables["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert variables["HCCL_IF_IP"] == "10.0.0.5"
    assert "HCCL_SOCKET_IFNAME" not in variables and "PYTORCH_NPU_ALLOC_CONF" not in variables


@pytest.mark.parametrize("devices", [1, 8, 16])
def test_port_ranges_fit_the_node_and_avoid_master_window_and_ephemeral(devices: int) -> None:
    host, npu = hccl_port_ranges(NpuSpec(), devices, (20000, 29999))
    assert host.high - host.low + 1 == devices * 16 == npu.high - npu.low + 1
    assert host.high < npu.low and npu.high <= 65535
    for low, high in ((20000, 29999), LINUX_EPHEMERAL):
        assert not host.overlaps(low, high) and not npu.overlaps(low, high)


def test_port_ranges_move_past_a_window_above_the_ephemeral_range() -> None:
    host, npu = hccl_port_ranges(NpuSpec(), 8, (61000, 62000))
    assert (host.low, npu.high) == (62001, 62256)


@pytest.mark.parametrize(
    ("sets", "key", "message"),
    [
        ([("environment.npu.connect_timeout_s", 60)], "environment.npu.connect_timeout_s",
         "HCCL_CONNECT_TIMEOUT must be within 120..7200 (CANN), got 60"),
        ([("environment.npu.exec_timeout_s", -1)], "environment.npu.exec_timeout_s",
         "HCCL_EXEC_TIMEOUT must be within 0..2147483647 (CANN), got -1"),
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
         "ports 25000-25255 overlap slurm.port_window 20000-29999"),
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
    config = config_with(tmp_path, ("environment.device", "cpu"), ("environment.npu.connect_timeout_s", 1))
    assert config.environment.npu.connect_timeout_s == 1


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


def run_setup(spec: NpuSpec, tmp_path: Path) -> subprocess.CompletedProcess:
    script = "\n".join([*npu_setup_lines(spec), 'echo "home=$ASCEND_HOME_PATH atb=${ATB_HOME_PATH:-none}"'])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=30,
                          check=False)


def test_missing_cann_stops_the_job_with_a_clear_message(tmp_path: Path) -> None:
    done = run_setup(NpuSpec(ascend_home=str(tmp_path / "Ascend")), tmp_path)
    assert done.returncode == PREFLIGHT_EXIT_CODE
    assert "CANN not found on" in done.stderr and f"{tmp_path}/Ascend/ascend-toolkit/set_env.sh" in done.stderr


def test_set_env_and_atb_are_sourced(tmp_path: Path) -> None:
    home = tmp_path / "Ascend"
    (home / "cann").mkdir(parents=True)
    (home / "cann/set_env.sh").write_text(f"export ASCEND_HOME_PATH={home}/cann\n")
    (home / "nnal/atb").mkdir(parents=True)
    (home / "nnal/atb/set_env.sh").write_text("export ATB_HOME_PATH=/atb\n")
    done = run_setup(NpuSpec(ascend_home=str(home)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"home={home}/cann atb=/atb"


def test_a_set_env_that_sets_nothing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.sh").write_text("true\n")
    done = run_setup(NpuSpec(set_env=str(tmp_path / "broken.sh")), tmp_path)
    assert done.returncode == PREFLIGHT_EXIT_CODE
    assert "did not set ASCEND_HOME_PATH" in done.stderr


def test_plan_sources_cann_before_exporting_and_keeps_cpu_jobs_clean(tmp_path: Path) -> None:
    setup = plan_job(config_with(tmp_path)).parameters["setup"]
    sourcing = next(i for i, line in enumerate(setup) if line.startswith('source "$slurm_titan_set_env"'))
    assert sourcing < setup.index("export HCCL_HOST_SOCKET_PORT_RANGE=61000-61127")
    assert "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in setup
    cpu_setup = plan_job(config_with(tmp_path, ("environment.device", "cpu"))).parameters["setup"]
    assert not any("HCCL" in line or "set_env" in line for line in cpu_setup)
