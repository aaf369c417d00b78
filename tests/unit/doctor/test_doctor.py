"""The preflight doctor: parsers on recorded npu-smi outputs, the checks, the file exchange between nodes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_titan.cli.main import main as cli_main
from slurm_titan.doctor import DoctorExpectations, PreflightFailed, exchange, run_preflight
from slurm_titan.doctor import facts as facts_module
from slurm_titan.doctor.checks import compare_nodes, node_findings
from slurm_titan.doctor.facts import NodeFacts, collect_facts, run_tool
from slurm_titan.doctor.npu_smi import parse_colon_fields, parse_key_values, parse_npu_smi_info
from slurm_titan.doctor.report import FAIL, WARN, Finding, format_table
from slurm_titan.errors import ExitCode
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
from tests.support.paths import DATA, REPO

SMI = DATA / "npu-smi"
NPU = DoctorExpectations(device="npu", devices_per_node=8, visible_devices=tuple(range(8)))


def recorded(name: str) -> str:
    return (SMI / name).read_text()


def npu_facts(rank: int = 0, info: str = "info_910b3_a2.txt", **changes: object) -> NodeFacts:
    base = NodeFacts(rank, f"n{rank + 1}", "npu",
                     {"python": "3.11.2", "slurm-titan": "0.1.0", "torch": "2.14.0", "torch_npu": "2.14.0",
                      "torchtitan": "0.3.0"},
                     npu_smi=parse_npu_smi_info(recorded(info)), firmware={str(i): "7.1.0.11.220" for i in range(8)},
                     cann_version="9.2.0", cann_ops_version="9.2.0", davinci=[f"davinci{i}" for i in range(8)],
                     device_count=8)
    return replace(base, **changes)


# ---- parsers -----------------------------------------------------------------------------


def test_atlas_a2_910b() -> None:
    info = parse_npu_smi_info(recorded("info_910b3_a2.txt"))
    assert (info.tool_version, info.driver_version) == ("23.0.7", "23.0.7")
    assert [chip.npu_id for chip in info.chips] == list(range(8))
    first = info.chips[0]
    assert (first.name, first.health, first.power_w, first.temp_c) == ("910B3", "OK", 98.3, 43)
    assert (first.chip_id, first.phy_id, first.bus_id, first.hbm_used_mb, first.hbm_total_mb) == \
        (0, None, "0000:C1:00.0", 3353, 65536)


def test_atlas_a3_two_dies_per_npu() -> None:
    info = parse_npu_smi_info(recorded("info_910_93_a3.txt"))
    assert info.driver_version == "24.1.rc3.3"
    assert len(info.chips) == 16
    die = info.chips[1]
    assert (die.npu_id, die.chip_id, die.phy_id, die.name, die.power_w, die.temp_c) == (0, 1, 1, "Ascend910", None, 40)
    assert [chip.phy_id for chip in info.chips] == list(range(16))


def test_ascend_950_layout() -> None:
    info = parse_npu_smi_info(recorded("info_950pr.txt"))
    assert info.driver_version == "25.7.rc1"
    assert {chip.name for chip in info.chips} == {"Ascend950PR"}
    assert (info.chips[3].npu_id, info.chips[3].chip_id, info.chips[3].hbm_total_mb) == (3, 0, 131072)
    assert info.chips[3].bus_id == "0000:71:00.0"


def test_unhealthy_chips_and_the_process_table_is_not_a_chip() -> None:
    info = parse_npu_smi_info(recorded("info_910b3_unhealthy.txt"))
    assert [chip.health for chip in info.chips] == ["OK", "OK", "OK", "Critical", "OK", "Alarm", "OK", "Warning"]
    assert info.chips[6].hbm_used_mb == 58012


def test_output_without_chips_is_an_error() -> None:
    with pytest.raises(ValueError, match="listed no chips"):
        parse_npu_smi_info("dcmi module initialize failed. ret is -8005\n")


def test_board_and_install_info() -> None:
    board = parse_colon_fields(recorded("board_910b3.txt"))
    assert (board["Software Version"], board["Firmware Version"], board["PCIe Bus Info"]) == \
        ("23.0.7", "7.1.0.11.220", "0000:C1:00.0")
    assert parse_key_values(recorded("ascend_toolkit_install.info"))["version"] == "8.1.RC1"


# ---- collecting ---------------------------------------------------------------------------


def test_missing_npu_smi_is_a_failed_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(facts_module, "probe_device_count", lambda: 8)
    failures = node_findings(collect_facts(NPU, 0), NPU)
    assert Finding(failures[0].node, "npu-smi", "npu-smi not on PATH", "`npu-smi info` listing the chips") in failures


def test_collector_reads_a_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "bin/npu-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\nif [ "$2" = "-t" ]; then cat {SMI}/board_910b3.txt; '
                    f'else cat {SMI}/info_910b3_a2.txt; fi\n')
    tool.chmod(0o755)
    home = tmp_path / "toolkit"
    arch = home / f"{facts_module.platform.machine()}-linux"
    arch.mkdir(parents=True)
    (arch / "ascend_toolkit_install.info").write_text(recorded("ascend_toolkit_install_8.5.0.info"))
    (arch / "ascend_ops_install.info").write_text(recorded("ascend_ops_install.info"))
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver/version.info").write_text(recorded("driver_version.info"))
    (tmp_path / "dev").mkdir()
    for i in range(8):
        (tmp_path / f"dev/davinci{i}").touch()
    (tmp_path / "dev/davinci_manager").touch()
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    monkeypatch.setattr(facts_module, "probe_device_count", lambda: 8)
    monkeypatch.setattr(facts_module, "DAVINCI", str(tmp_path / "dev/davinci[0-9]*"))
    facts = collect_facts(replace(NPU, checkpoint_dir=str(tmp_path / "ckpt/{job_id}"), ascend_home=str(tmp_path)), 0)
    assert (facts.npu_smi.driver_version, facts.cann_version, facts.device_count) == ("23.0.7", "8.5.0", 8)
    assert (facts.cann_ops_version, facts.driver["Innerversion"], facts.davinci[-1]) == \
        ("8.5.0", "V100R001C15SPC006B220", "davinci7")
    assert facts.cann_compatible.startswith("[V100R001C15],") and facts.network is None  # no hccn_tool here
    assert set(facts.firmware.values()) == {"7.1.0.11.220"} and len(facts.firmware) == 8
    assert facts.disk_path == str(tmp_path) and facts.disk_free_bytes > 0
    assert NodeFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    problems = {f.check for f in node_findings(facts, NPU)} - {"torch_npu"}  # torch_npu is not installed here
    assert not problems


def test_a_hanging_tool_times_out() -> None:
    with pytest.raises(facts_module.FactError, match="timed out after 0 s"):
        run_tool(["sleep", "5"], timeout_s=0.2)


# ---- checks -------------------------------------------------------------------------------


def test_unhealthy_and_busy_chips_fail_warning_passes() -> None:
    failures = node_findings(npu_facts(info="info_910b3_unhealthy.txt"), NPU)
    assert [(f.check, f.found) for f in failures] == [
        ("chip health", "NPU 3 chip 0 (910B3): Critical"),
        ("temperature", "NPU 3 chip 0 (910B3): 96 C"),
        ("chip health", "NPU 5 chip 0 (910B3): Alarm"),
        ("chip busy", "NPU 6 chip 0 (910B3): 58012/65536 MB HBM in use; held by pid 731204 (python3, 54682 MB)"),
    ]
    assert not node_findings(npu_facts(info="info_910b3_unhealthy.txt"), replace(NPU, visible_devices=(0, 1)))


def test_node_checks_against_the_config() -> None:
    expect = replace(NPU, visible_devices=tuple(range(8, 16)), checkpoint_bytes=500 * 10**9,
                     checkpoint_size_source="estimated", socket_ifnames=("ib0",), hccl_port_ranges=((61000, 61127),))
    facts = npu_facts(device_count=4, disk_path="/ckpt", disk_free_bytes=120 * 10**9, interfaces=["eth0", "lo"],
                      ephemeral_range=(32768, 65000), firmware={"0": "7.1.0.11.220", "1": "7.1.0.7.220"})
    found = {f.check: f.found for f in node_findings(facts, expect)}
    assert found == {
        "chips": "8 chips",
        "firmware": "7.1.0.11.220, 7.1.0.7.220",
        "device count": "4 (torch.npu.device_count())",
        "disk": "120.0 GB free at /ckpt",
        "network interface": "no ib0 (has eth0, lo)",
        "HCCL ports": "61000-61127 overlaps this node's ephemeral ports 32768-65000 (61000-61127 not reserved)",
    }


def test_the_ram_tier_needs_four_shares_in_its_folder_and_five_of_host_memory() -> None:
    share = 100 * 10**9
    expect = replace(NPU, memory_dir="/dev/shm", memory_bytes=4 * share, checkpoint_size_source="estimated / 8 node(s)")
    enough = npu_facts(memory_path="/dev/shm", memory_free_bytes=400 * 10**9, mem_available_bytes=500 * 10**9)
    assert [f for f in node_findings(enough, expect) if f.check == "RAM tier"] == []
    short = replace(enough, memory_free_bytes=300 * 10**9, mem_available_bytes=450 * 10**9)
    rows = [(f.found, f.expected, f.severity) for f in node_findings(short, expect) if f.check == "RAM tier"]
    assert rows == [("300.0 GB free at /dev/shm",
                     ">= 400.0 GB (4 snapshots of the node's share: estimated / 8 node(s))", FAIL),
                    ("450.0 GB of memory available", ">= 500.0 GB (the snapshots and the ranks' staging copy)", FAIL)]
    optional = replace(expect, memory_required=False)
    assert {f.severity for f in node_findings(short, optional) if f.check == "RAM tier"} == {WARN}


def test_a_standby_step_counts_its_processes_with_the_ram_tiers_host_memory_and_warns_when_short() -> None:
    expect = replace(NPU, standby_bytes=8 * 650 * 10**6)
    assert [f for f in node_findings(npu_facts(mem_available_bytes=6 * 10**9), expect)
            if f.check == "standby step"] == []
    rows = [(f.found, f.expected, f.severity) for f in node_findings(npu_facts(mem_available_bytes=5 * 10**9), expect)
            if f.check == "standby step"]
    assert rows == [("5.0 GB of memory available",
                     ">= 5.2 GB (a standby process per rank, 5.2 GB: preemption.standby_step)", WARN)]
    with_tier = replace(expect, memory_dir="/dev/shm", memory_bytes=4 * 10**9)
    short = npu_facts(memory_path="/dev/shm", memory_free_bytes=10**10, mem_available_bytes=8 * 10**9)
    assert [(f.check, f.expected) for f in node_findings(short, with_tier) if f.severity == WARN] == [
        ("standby step", ">= 10.2 GB (a standby process per rank, 5.2 GB and the RAM tier's 5.0 GB: "
                         "preemption.standby_step)")]


def test_mixed_drivers_chips_and_versions_are_named() -> None:
    nodes = [npu_facts(0), npu_facts(1), npu_facts(2, info="info_950pr.txt"),
             npu_facts(3, versions={**npu_facts().versions, "torch": "2.13.0"})]
    failures = compare_nodes(nodes)
    assert [(f.node, f.check, f.found, f.expected) for f in failures] == [
        ("2 (n3)", "chip type", "Ascend950PR", "910B3 (as on 3 of 4 nodes)"),
        ("2 (n3)", "driver", "25.7.rc1", "23.0.7 (as on 3 of 4 nodes)"),
        ("3 (n4)", "torch", "2.13.0", "2.14.0 (as on 3 of 4 nodes)"),
    ]


def test_a_tie_expects_the_lowest_node_rank_and_agreement_passes() -> None:
    pair = [npu_facts(1, cann_version="9.1.0"), npu_facts(0)]
    assert [(f.node, f.found, f.expected) for f in compare_nodes(pair)] == \
        [("1 (n2)", "9.1.0", "9.2.0 (as on 1 of 2 nodes)")]
    assert compare_nodes([npu_facts(0), npu_facts(1)]) == []


def test_table_format_and_exception() -> None:
    findings = [Finding("0 (n1)", "driver", "24.1.rc3", "23.0.7 (as on 7 of 8 nodes)"),
                Finding("12", "preflight", "no report within 600 s", "node-12.json"),
                Finding("3 (n4)", "temperature", "NPU 0 chip 0 (910B3): 78 C", "below 75 C", WARN)]
    assert format_table(findings) == (
        "node    level  check        found                       expected\n"
        "------  -----  -----------  --------------------------  ---------------------------\n"
        "0 (n1)  fail   driver       24.1.rc3                    23.0.7 (as on 7 of 8 nodes)\n"
        "12      fail   preflight    no report within 600 s      node-12.json\n"
        "3 (n4)  warn   temperature  NPU 0 chip 0 (910B3): 78 C  below 75 C")
    error = PreflightFailed(findings, 16)
    assert error.exit_code == ExitCode.PREFLIGHT == 78
    assert str(error).startswith("preflight failed: 2 problem(s) on 2 of 16 node(s), 1 warning(s); "
                                 "training not started\nnode ")


def test_expectations_of_the_70b_job() -> None:
    node = plan_job(load_config(REPO / "configs/llama3_70b_npu.yaml")).node
    expect = node.preflight.for_job(lambda text: node.fill(text, "7"))
    assert expect.checkpoint_dir == str(REPO / "runs/llama3-70b-npu/7/dump/checkpoint")
    assert expect.checkpoint_bytes == math.ceil(70_553_706_496 * 12 / 8)
    assert expect.checkpoint_size_source == "estimated: 70.55B parameters x 12 B / 8 node(s)"
    assert (expect.visible_devices, expect.hccl_port_ranges) == \
        (tuple(range(8)), ((61000, 61127), (61256, 61287)))  # the host's blocks, not the NPU socket block


# ---- the exchange between nodes -----------------------------------------------------------


CPU = DoctorExpectations(device="cpu", devices_per_node=1)


def run_nodes(job_dir: Path, ranks: list[int], num_nodes: int, collect=collect_facts, timeout_s: float = 30,
              expect: DoctorExpectations = CPU) -> dict[int, object]:
    """run_preflight on several simulated nodes at once (threads); each rank's outcome (None or the exception)."""
    outcome: dict[int, object] = {}

    def node(rank: int) -> None:
        try:
            run_preflight(job_dir, 0, rank, num_nodes, expect, timeout_s, collect=collect)
            outcome[rank] = None
        except PreflightFailed as error:
            outcome[rank] = error

    threads = [threading.Thread(target=node, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcome


def test_three_cpu_nodes_agree(tmp_path: Path) -> None:
    expect = DoctorExpectations(device="cpu", devices_per_node=1, checkpoint_dir=str(tmp_path / "ckpt"),
                                checkpoint_bytes=1)
    assert run_nodes(tmp_path, [0, 1, 2], 3, expect=expect) == {0: None, 1: None, 2: None}
    folder = tmp_path / "doctor/attempt-0"
    assert sorted(p.name for p in folder.iterdir()) == ["node-0.json", "node-1.json", "node-2.json", "verdict.json"]
    assert json.loads((folder / "verdict.json").read_text()) == {"nodes": 3, "findings": []}


def test_one_odd_node_stops_every_node_with_the_same_table(tmp_path: Path) -> None:
    def collect(expect: DoctorExpectations, rank: int) -> NodeFacts:
        return npu_facts(rank, versions={**npu_facts().versions, "torch": "2.13.0" if rank == 2 else "2.14.0"})

    outcome = run_nodes(tmp_path, [0, 1, 2], 3, collect=collect, expect=NPU)
    assert all(isinstance(error, PreflightFailed) for error in outcome.values())
    assert len({str(error) for error in outcome.values()}) == 1
    assert Finding("2 (n3)", "torch", "2.13.0", "2.14.0 (as on 2 of 3 nodes)") in outcome[0].findings


def test_a_silent_node_fails_the_preflight(tmp_path: Path) -> None:
    outcome = run_nodes(tmp_path, [0, 1], 3, timeout_s=1)
    assert [(f.node, f.check, f.found) for f in outcome[0].findings] == [("2", "preflight", "no report within 1 s")]
    assert outcome[1].findings == outcome[0].findings


def test_no_verdict_fails_the_other_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "VERDICT_GRACE_S", 0.5)
    failures = run_nodes(tmp_path, [1], 2, timeout_s=0.5)[1].findings
    assert [(f.check, f.found) for f in failures] == [("preflight", "no verdict from node 0 within 1 s")]


# ---- by hand ------------------------------------------------------------------------------


def test_doctor_by_hand_on_a_cpu_node(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_TITAN_DEVICE", "cpu")
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == [] and report["facts"]["versions"]["torchtitan"] == "0.3.0"


def test_doctor_by_hand_with_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(f"name: x\nruns_dir: {tmp_path}/runs\nenvironment: {{device: cpu}}\n"
                      "checkpoint: {enable: true, expected_size_gb: 1000000}\n")
    assert cli_main(["doctor", "--config", str(config)]) == ExitCode.PREFLIGHT
    out = capsys.readouterr().out
    assert "checkpoint disk:" in out
    assert "disk   " in out and ">= 1000000.0 GB for a checkpoint (checkpoint.expected_size_gb / 1 node(s))" in out


def test_doctor_by_hand_without_npu_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_TITAN_DEVICE", "npu")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(facts_module, "probe_device_count", lambda: 8)
    assert cli_main(["doctor"]) == ExitCode.PREFLIGHT
    out = capsys.readouterr().out
    assert any(line.split()[2:4] == ["fail", "npu-smi"] and line.endswith("`npu-smi info` listing the chips")
               for line in out.splitlines() if "npu-smi not on PATH" in line)


def test_the_doctor_does_not_import_torch() -> None:
    code = "import sys, slurm_titan.cli.doctor; print(sorted(m for m in ('torch', 'torch_npu') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
