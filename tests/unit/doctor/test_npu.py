"""The doctor's NPU checks: temperature, versions, the ops package, device files, reserved ports, hccn_tool."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_titan.cli import doctor as doctor_cli
from slurm_titan.cli.main import main as cli_main
from slurm_titan.doctor import PreflightFailed, hccn_tool, run_preflight, versions
from slurm_titan.doctor import facts as facts_module
from slurm_titan.doctor.checks import compare_nodes, node_findings, reachability
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.doctor.facts import FactError, NodeFacts, cann_ops_version, collect_facts
from slurm_titan.doctor.hccn_tool import HccnDevice
from slurm_titan.doctor.npu_smi import ChipProcess, parse_key_values, parse_npu_smi_info
from slurm_titan.doctor.ports import format_ranges, parse_port_list, uncovered
from slurm_titan.doctor.report import FAIL, WARN
from slurm_titan.launch.config import load_config
from slurm_titan.launch.preflight import preflight_expectations
from tests.support.paths import DATA, REPO

SMI = DATA / "npu-smi"
HCCN = DATA / "hccn_tool"
NPU = DoctorExpectations(device="npu", devices_per_node=8, visible_devices=tuple(range(8)))
PORT = HccnDevice("10.10.100.10", "UP", "Success", 0)


def npu_facts(rank: int = 0, info: str = "info_910b3_a2.txt", **changes: object) -> NodeFacts:
    base = NodeFacts(rank, f"n{rank + 1}", "npu",
                     {"python": "3.11.2", "slurm-titan": "0.1.0", "torch": "2.14.0", "torch_npu": "2.14.0",
                      "torchtitan": "0.3.0"},
                     npu_smi=parse_npu_smi_info((SMI / info).read_text()),
                     firmware={str(i): "7.1.0.11.220" for i in range(8)}, cann_version="9.2.0",
                     cann_ops_version="9.2.0", davinci=[f"davinci{i}" for i in range(8)], device_count=8)
    return replace(base, **changes)


def found(findings: list, check: str) -> list[tuple[str, str]]:
    return [(f.severity, f.found) for f in findings if f.check == check]


def with_temps(facts: NodeFacts, *temps: int) -> NodeFacts:
    chips = tuple(replace(chip, temp_c=temp) for chip, temp in zip(facts.npu_smi.chips, temps))
    return replace(facts, npu_smi=replace(facts.npu_smi, chips=chips + facts.npu_smi.chips[len(temps):]))


# ---- temperature, A3, devices -------------------------------------------------------------


def test_temperature_warns_at_75_and_fails_at_85() -> None:
    findings = node_findings(with_temps(npu_facts(), 74, 75, 84, 85), NPU)
    assert found(findings, "temperature") == [(WARN, "NPU 1 chip 0 (910B3): 75 C"),
                                              (WARN, "NPU 2 chip 0 (910B3): 84 C"),
                                              (FAIL, "NPU 3 chip 0 (910B3): 85 C")]
    assert {f.expected for f in findings if f.check == "temperature"} == {"below 75 C (at 85 C the NPU throttles)"}
    custom = node_findings(with_temps(npu_facts(), 80), replace(NPU, temp_warn_c=90, temp_fail_c=95))
    assert found(custom, "temperature") == []


# ---- busy chips -----------------------------------------------------------------------------


def test_the_process_table_names_who_holds_a_chip() -> None:
    busy = parse_npu_smi_info((SMI / "info_910b3_busy.txt").read_text())
    assert busy.processes == (ChipProcess(2, 0, 48211, "python3", 57388),)
    assert [chip.npu_id for chip in busy.chips if chip.busy] == [2, 5]
    assert parse_npu_smi_info((SMI / "info_910b3_a2.txt").read_text()).processes == ()
    facts = npu_facts(info="info_910b3_busy.txt")
    assert NodeFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    assert found(node_findings(facts, NPU), "chip busy") == [
        (FAIL, "NPU 2 chip 0 (910B3): 60741/65536 MB HBM in use; held by pid 48211 (python3, 57388 MB)"),
        (FAIL, "NPU 5 chip 0 (910B3): 61802/65536 MB HBM in use; npu-smi shows no holder (another container's "
               "process, or memory not yet freed)")]
    assert {f.expected for f in node_findings(facts, NPU) if f.check == "chip busy"} == {
        "an idle chip (under 50% HBM used) within 120 s"}


class FakeClock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, 0

    def sleep(self, seconds: float) -> None:
        self.now, self.sleeps = self.now + seconds, self.sleeps + 1


def readings(*names: str):
    """`npu-smi info` as read again and again: these recordings in turn, then the last one for ever."""
    infos = [parse_npu_smi_info((SMI / name).read_text()) for name in names]
    return lambda: infos.pop(0) if len(infos) > 1 else infos[0]


def test_the_doctor_waits_for_a_killed_ranks_chip_to_be_released() -> None:
    clock = FakeClock()
    info = facts_module.wait_until_released(readings("info_910b3_busy.txt", "info_910b3_busy.txt",
                                                     "info_910b3_a2.txt"), NPU.visible_devices, 120, 5,
                                            lambda: clock.now, clock.sleep)
    assert not any(chip.busy for chip in info.chips) and clock.sleeps == 2
    clock = FakeClock()  # still held: the last reading after at most the wait, then judged busy
    info = facts_module.wait_until_released(readings("info_910b3_busy.txt"), NPU.visible_devices, 120, 5,
                                            lambda: clock.now, clock.sleep)
    assert [chip.npu_id for chip in info.chips if chip.busy] == [2, 5] and clock.now == 120
    clock = FakeClock()  # busy chips outside the job's devices are not waited for
    facts_module.wait_until_released(readings("info_910b3_busy.txt"), (0, 1), 120, 5, lambda: clock.now, clock.sleep)
    assert clock.sleeps == 0


def test_a3_chips_warn_that_the_npu_attention_is_undocumented_there() -> None:
    a3 = node_findings(npu_facts(info="info_910_93_a3.txt"), replace(NPU, visible_devices=()))
    assert [(f.severity, f.check) for f in a3] == [(WARN, "npu_fusion_attention")]
    assert "Atlas A2 training or Ascend 950" in a3[0].expected
    assert not node_findings(npu_facts(), NPU)


def test_zero_devices_fail_without_a_config_and_name_the_gres() -> None:
    config_free = DoctorExpectations(device="npu")
    findings = node_findings(npu_facts(device_count=0, davinci=[]), config_free)
    assert found(findings, "device count") == [(FAIL, "0 (torch.npu.device_count())")]
    assert found(findings, "NPU devices") == [(FAIL, "no /dev/davinci<N> device files")]
    assert all("--gres=npu:N (slurm.gres)" in f.expected and "cgroups" in f.expected for f in findings)
    assert not node_findings(npu_facts(device_count=8), config_free)


# ---- versions -----------------------------------------------------------------------------


def test_release_and_compatible_lists() -> None:
    assert [versions.release(v) for v in ("2.14.0.post1", "2.14.0+cpu", "2.14")] == ["2.14.0"] * 3
    assert versions.release("8.1.RC1", 2) == "8.1" and versions.release("latest") is None
    toolkit = parse_key_values((SMI / "ascend_toolkit_install_8.5.0.info").read_text())
    assert versions.parse_compatible(toolkit["compatible_version"])[:2] == ("V100R001C15", "V100R001C18")


def test_torch_npu_table() -> None:
    assert versions.torch_npu_rows("2.14.0+cpu", "2.14.0", "9.2.0") == []
    assert versions.torch_npu_rows("2.14.0", "2.14.0", "8.5.0") == []
    (check, what, expected, severity), = versions.torch_npu_rows("2.14.1", "2.14.0", "9.2.0")
    assert (check, severity, what) == ("torch_npu", FAIL, "torch 2.14.1 with torch_npu 2.14.0")
    (_, what, expected, severity), = versions.torch_npu_rows("2.14.0", "2.14.0", "8.1.RC1")
    assert severity == FAIL and "8.5.X to 9.2.X, recommended 9.2.0" in expected and versions.TABLE in expected
    (_, what, _, severity), = versions.torch_npu_rows("2.13.0", "2.13.0", "9.2.0")
    assert (severity, what) == (WARN, "torch_npu 2.13.0 is not in the table")


def test_a_cann_outside_the_table_fails_the_preflight_naming_the_node(tmp_path: Path) -> None:
    cann = {1: "8.3.RC1", 2: "9.3.0"}
    outcome = run_nodes(tmp_path, 3, lambda expect, rank: npu_facts(
        rank, cann_version=cann.get(rank, "9.2.0"), cann_ops_version=cann.get(rank, "9.2.0")), None)
    assert all(isinstance(error, PreflightFailed) and error.exit_code == 78 for error in outcome.values())
    assert [(f.node, f.found) for f in outcome[0].findings if f.severity == FAIL and "table" in f.found] == [
        ("1 (n2)", "CANN 8.3.RC1 with torch_npu 2.14.0 is not in the table"),
        ("2 (n3)", "CANN 9.3.0 with torch_npu 2.14.0 is not in the table")]


def test_the_newest_cann_layout_is_read_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module.platform, "machine", lambda: "aarch64")
    for home, version in (("ascend-toolkit/latest", "8.3.RC1"), ("cann", "9.2.0")):
        (tmp_path / home / "aarch64-linux").mkdir(parents=True)
        (tmp_path / home / "aarch64-linux/ascend_toolkit_install.info").write_text(f"version={version}\n")
    path, fields = facts_module.cann_install(str(tmp_path), {})
    assert (path.parent.parent, fields["version"]) == (tmp_path / "cann", "9.2.0")


def test_driver_against_the_toolkits_compatible_drivers() -> None:
    driver = parse_key_values((SMI / "driver_version.info").read_text())
    toolkit = parse_key_values((SMI / "ascend_toolkit_install_8.5.0.info").read_text())
    facts = npu_facts(driver=driver, cann_version="8.5.0", cann_ops_version="8.5.0",
                      cann_compatible=toolkit["compatible_version"])
    assert not node_findings(facts, NPU)
    newer = node_findings(replace(facts, driver={**driver, "Innerversion": "V100R001C30SPC001B100"}), NPU)
    assert found(newer, "driver") == [(FAIL, "driver 24.1.rc1 (V100R001C30SPC001B100) is not among "
                                             "CANN 8.5.0's compatible drivers")]


def test_a_missing_driver_version_file_is_a_warning(tmp_path: Path) -> None:
    facts = npu_facts(problems={"driver version": f"no {tmp_path}/driver/version.info"})
    assert [(f.severity, f.check) for f in node_findings(facts, NPU)] == [(WARN, "driver version")]


# ---- the ops (kernels) package ------------------------------------------------------------


def test_ops_package_of_cann_85_and_of_83(tmp_path: Path) -> None:
    arch = tmp_path / "cann/aarch64-linux"
    arch.mkdir(parents=True)
    info = arch / "ascend_toolkit_install.info"
    with pytest.raises(FactError, match="ops \\(kernels\\) package for this chip is not installed"):
        cann_ops_version(info)
    (arch / "ascend_ops_install.info").write_text((SMI / "ascend_ops_install.info").read_text())
    assert cann_ops_version(info) == "8.5.0"
    old = tmp_path / "ascend-toolkit/latest"
    (old / "aarch64-linux").mkdir(parents=True)
    (old / "opp_kernel").mkdir()
    (old / "opp_kernel/version.info").write_text((SMI / "opp_kernel_version.info").read_text())
    assert cann_ops_version(old / "aarch64-linux/ascend_toolkit_install.info") == "8.3.RC1.alpha001"


def test_ops_package_missing_or_of_another_release_fails() -> None:
    missing = node_findings(npu_facts(cann_ops_version=None, problems={"CANN ops": "no ascend_ops_install.info"}), NPU)
    assert found(missing, "CANN ops") == [(FAIL, "no ascend_ops_install.info")]
    other = node_findings(npu_facts(cann_ops_version="9.1.0"), NPU)
    assert found(other, "CANN ops") == [(FAIL, "ops (kernels) package 9.1.0 with toolkit 9.2.0")]


# ---- reserved ports -----------------------------------------------------------------------


def test_reserved_ports_list() -> None:
    assert parse_port_list("60000-60031,8080\n") == ((60000, 60031), (8080, 8080))
    assert parse_port_list("\n") == ()
    for bad in ("60000-", "a-b", "60031-60000"):
        with pytest.raises(ValueError):
            parse_port_list(bad)
    assert uncovered(60000, 60031, ((60000, 60031),)) == ()
    assert uncovered(60000, 60031, ((60010, 60015), (59000, 60003))) == ((60004, 60009), (60016, 60031))
    assert format_ranges(((60004, 60009), (60016, 60016))) == "60004-60009,60016"


def test_a_fully_reserved_block_inside_the_ephemeral_range_passes() -> None:
    expect = replace(NPU, hccl_port_ranges=((60000, 60031), (61000, 61127)))
    base = npu_facts(ephemeral_range=(32768, 60999))
    assert found(node_findings(replace(base, reserved_ports=((60000, 60031),)), expect), "HCCL ports") == []
    partly = node_findings(replace(base, reserved_ports=((60000, 60015),)), expect)
    assert found(partly, "HCCL ports") == [
        (FAIL, "60000-60031 overlaps this node's ephemeral ports 32768-60999 (60016-60031 not reserved)")]
    assert "sysctl -w net.ipv4.ip_local_reserved_ports=60016-60031" in partly[0].expected


def test_a_wide_ephemeral_range_judges_the_host_blocks_not_the_npu_block() -> None:
    """A host whose ephemeral range is every unprivileged port, with the host's HCCL blocks reserved as CANN says:
    the NPU socket block 61128-61255 (bound on the NPU's network port, not the host's) is not judged."""
    expect = preflight_expectations(load_config(REPO / "configs/llama3_8b_npu_1node.yaml"), None)
    host, root = (61000, 61127), (61256, 61287)
    facts = npu_facts(ephemeral_range=(1024, 65535), reserved_ports=(host, root))
    assert found(node_findings(facts, expect), "HCCL ports") == []
    assert found(node_findings(replace(facts, reserved_ports=(host,)), expect), "HCCL ports") == [
        (FAIL, "61256-61287 overlaps this node's ephemeral ports 1024-65535 (61256-61287 not reserved)")]


# ---- hccn_tool ----------------------------------------------------------------------------


def test_hccn_tool_recordings() -> None:
    assert hccn_tool.parse_ip((HCCN / "ip_g.txt").read_text()) == "10.10.100.10"
    assert hccn_tool.parse_link((HCCN / "link_g.txt").read_text()) == "UP"
    assert hccn_tool.parse_net_health((HCCN / "net_health_init.txt").read_text()) == "Init"
    assert hccn_tool.parse_net_health((HCCN / "net_health_success.txt").read_text()) == "Success"
    assert hccn_tool.parse_tls_switch((HCCN / "tls_g.txt").read_text()) == 0
    assert hccn_tool.parse_ping((HCCN / "ping_ok.txt").read_text()) == (3, 3)
    assert hccn_tool.parse_ping((HCCN / "ping_loss.txt").read_text()) == (3, 2)
    with pytest.raises(ValueError, match="packets transmitted"):
        hccn_tool.parse_ping("hccn_tool is busy, please try again\n")
    assert hccn_tool.parse_ip("") is None


def test_device_network_fails_a_multi_node_job_and_warns_otherwise() -> None:
    network = {"0": PORT, "1": HccnDevice(None, "DOWN", "Receive timeout", 1)}
    facts = npu_facts(network=network)
    alone = node_findings(facts, NPU)
    assert {f.severity for f in alone} == {WARN}
    assert [(f.check, f.found) for f in node_findings(facts, NPU, num_nodes=2)] == [
        ("device IP", "NPU network port 1: no IP"), ("device link", "NPU network port 1: link DOWN"),
        ("device network", "NPU network port 1: Receive timeout"), ("device TLS", "TLS switches 0, 1 on one node")]
    assert not node_findings(npu_facts(network={"0": replace(PORT, net_health="Init")}), NPU, num_nodes=2)


def test_tls_must_agree_and_device_ips_differ_across_nodes() -> None:
    nodes = [npu_facts(0, network={"0": PORT}), npu_facts(1, network={"0": replace(PORT, ip="10.10.100.11")}),
             npu_facts(2, network={"0": replace(PORT, ip="10.10.100.12", tls_switch=1)}),
             npu_facts(3, network={"0": PORT})]
    assert [(f.node, f.check, f.found) for f in compare_nodes(nodes)] == [
        ("2 (n3)", "device TLS", "1"),
        ("3 (n4)", "device IP", "NPU network port 0: 10.10.100.10, as port 0 of node 0 (n1)")]


def test_collector_reads_hccn_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(f"#!/bin/sh\ncat {SMI}/info_910_93_a3.txt\n")
    (bin_dir / "hccn_tool").write_text(
        '#!/bin/sh\ncase "$3" in -ip) echo "ipaddr:10.0.0.$2"; echo netmask:255.255.255.0;; '
        f'-link) cat {HCCN}/link_g.txt;; -net_health) cat {HCCN}/net_health_init.txt;; '
        f'-tls) cat {HCCN}/tls_g.txt;; *) exit 1;; esac\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(facts_module, "probe_device_count", lambda: 16)
    facts = collect_facts(DoctorExpectations(device="npu", ascend_home=str(tmp_path),
                                             visible_devices=(0, 1, 15)), 0)
    assert facts.network == {device: HccnDevice(f"10.0.0.{device}", "UP", "Init", 0) for device in ("0", "1", "15")}
    assert NodeFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts


# ---- the NPU kernels (doctor.check_kernels) ------------------------------------------------


VERDICTS = """ok   rope.tables bfloat16: max error 0 (tolerance 0) in B1 L130 heads 4/2 D16 docs 3, 7 cases
FAIL attention.npu_kernel bfloat16 fwd: max error 0.31 (tolerance 0.02) in B2 L8192 heads 64/8 D128 docs 5/16, 7 cases
ok   rmsnorm.npu_kernel bfloat16 bwd: max error 0.0039 (tolerance 0.04) in B1 L64 heads 2/1 D8 docs 2, 7 cases
"""


def test_the_kernel_check_runs_only_when_asked_and_fails_the_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(facts_module, "run_tool", lambda argv, *args, **kwargs: calls.append(argv) or VERDICTS)
    assert facts_module.probe_kernels() == [
        "attention.npu_kernel bfloat16 fwd: max error 0.31 (tolerance 0.02) in B2 L8192 heads 64/8 D128 docs 5/16, "
        "7 cases"]
    assert calls[0][1:] == ["-m", "slurm_titan.overrides.check"]
    monkeypatch.setattr(facts_module, "probe_device_count", lambda: 8)
    assert collect_facts(NPU, 0).kernel_failures is None  # doctor.check_kernels is off by default
    facts = collect_facts(replace(NPU, check_kernels=True), 0)
    assert facts.kernel_failures == facts_module.probe_kernels() and len(facts.kernel_failures) == 1
    assert found(node_findings(facts, NPU), "NPU kernels") == [(FAIL, facts.kernel_failures[0])]
    assert not found(node_findings(npu_facts(kernel_failures=[]), NPU), "NPU kernels")


def test_the_kernel_check_child_without_an_npu_is_a_failure_saying_why() -> None:
    with pytest.raises(FactError, match="the NPU kernel check exited 2: check-overrides --device npu: torch_npu"):
        facts_module.probe_kernels()  # this machine: torch, no torch_npu


def test_a_lost_ping_fails_and_a_full_one_passes() -> None:
    mine, peer = npu_facts(0, network={"0": PORT}), npu_facts(1, network={"0": replace(PORT, ip="10.10.100.11")})
    assert reachability(mine, peer, "0", "10.10.100.11", (3, 3)) == []
    (lost,) = reachability(mine, peer, "0", "10.10.100.11", (3, 2))
    assert (lost.check, lost.found) == ("device reachability",
                                        "hccn_tool -i 0 -ping -g address 10.10.100.11: 2 of 3 packets received")
    (broken,) = reachability(mine, peer, "0", "10.10.100.11", "hccn_tool is not installed")
    assert broken.found.endswith(": hccn_tool is not installed")


# ---- the exchange: pings between nodes, warnings returned ---------------------------------


def run_nodes(job_dir: Path, num_nodes: int, collect, ping) -> dict[int, object]:
    outcome: dict[int, object] = {}

    def node(rank: int) -> None:
        try:
            outcome[rank] = run_preflight(job_dir, 0, rank, num_nodes, NPU, 20, collect=collect, ping=ping)
        except PreflightFailed as error:
            outcome[rank] = error

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(num_nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcome


def ring_facts(expect: DoctorExpectations, rank: int) -> NodeFacts:
    return npu_facts(rank, info="info_910_93_a3.txt", network={"0": replace(PORT, ip=f"10.10.100.{rank}")})


def test_every_node_pings_the_next_one(tmp_path: Path) -> None:
    pinged: list[tuple[str, str]] = []

    def ping(home: str, device: str, address: str) -> tuple[int, int]:
        pinged.append((device, address))
        return (3, 3)

    outcome = run_nodes(tmp_path, 3, ring_facts, ping)
    assert sorted(pinged) == [("0", "10.10.100.0"), ("0", "10.10.100.1"), ("0", "10.10.100.2")]
    warnings = outcome[0]  # A3 chips: warnings only, the preflight passes and returns them
    assert {(f.node, f.check) for f in warnings} == {(f"{r} (n{r + 1})", "npu_fusion_attention") for r in range(3)}
    assert outcome[1] == outcome[2] == warnings
    assert sorted(p.name for p in (tmp_path / "doctor/attempt-0").glob("reach-*.json")) == \
        ["reach-0.json", "reach-1.json", "reach-2.json"]


def test_an_unreachable_node_stops_the_job(tmp_path: Path) -> None:
    def ping(home: str, device: str, address: str) -> tuple[int, int]:
        if address == "10.10.100.1":
            raise FactError("hccn_tool exited 1: recv time out seq:0")
        return (3, 3)

    outcome = run_nodes(tmp_path, 2, ring_facts, ping)
    assert all(isinstance(error, PreflightFailed) for error in outcome.values())
    assert [(f.node, f.check) for f in outcome[0].findings if f.severity == FAIL] == \
        [("0 (n1)", "device reachability")]


def test_doctor_by_hand_prints_warnings_in_json(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(doctor_cli, "collect_facts", lambda expect, node_rank: npu_facts(info="info_910_93_a3.txt"))
    monkeypatch.setattr(doctor_cli, "expectations", lambda path: DoctorExpectations(device="npu"))
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == [] and [w["check"] for w in report["warnings"]] == ["npu_fusion_attention"]
    assert cli_main(["doctor"]) == 0
    assert "warn   npu_fusion_attention" in capsys.readouterr().out
