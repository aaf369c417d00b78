"""`slurm-titan doctor [--config CONFIG] [--json]`: the preflight checks of this node, by hand.

Without a config it checks what needs none (npu-smi, every chip's health and temperature, CANN and its ops
package, driver / CANN / torch_npu compatibility, torch_npu seeing any NPU, the NPUs' network ports); with one,
also the job's device count, visible devices, interfaces, ports and checkpoint disk. Warnings are printed with
the failures (`--json`: under "warnings"); exit 0 unless a check failed, ExitCode.PREFLIGHT then. Cross-node
checks need a job: they run in every job's preflight.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict

from slurm_titan import envvars
from slurm_titan.cli.base import SubCommand
from slurm_titan.doctor.checks import node_findings
from slurm_titan.doctor.expectations import GB, DoctorExpectations
from slurm_titan.doctor.facts import NodeFacts, collect_facts
from slurm_titan.doctor.report import FAIL, WARN, failures, format_table
from slurm_titan.errors import ExitCode


def expectations(config_path: str | None) -> DoctorExpectations:
    """The job's own preflight expectations (as `submit` plans them), or the config-free ones."""
    if config_path is None:
        return DoctorExpectations(device=os.environ.get(envvars.DEVICE, "npu"))
    from slurm_titan.launch.config import load_config
    from slurm_titan.launch.plan import plan_job

    node = plan_job(load_config(config_path)).node
    assert node.preflight is not None, "plan_job plans a preflight for every job"
    return node.preflight.for_job(lambda text: node.fill(text, "doctor"))


def describe(facts: NodeFacts) -> str:
    """The facts a person looks at first, a few lines."""
    versions = ", ".join(f"{name} {version or '-'}" for name, version in facts.versions.items())
    lines = [f"node {facts.label}, device {facts.device}", versions]
    if facts.device == "npu":
        smi = facts.npu_smi
        firmware = ", ".join(sorted(set(facts.firmware.values()))) or "-"
        count = "-" if facts.device_count is None else facts.device_count
        lines.append(f"driver {smi.driver_version if smi else '-'}, firmware {firmware}, "
                     f"CANN {facts.cann_version or '-'} (ops {facts.cann_ops_version or '-'}), "
                     f"torch_npu sees {count} device(s), {len(facts.davinci or [])} /dev/davinci*")
        for chip in smi.chips if smi else ():
            hbm = f"{chip.hbm_used_mb}/{chip.hbm_total_mb} MB HBM" if chip.hbm_total_mb else "HBM -"
            lines.append(f"  NPU {chip.npu_id} chip {chip.chip_id}: {chip.name} {chip.health}, "
                         f"{chip.temp_c if chip.temp_c is not None else '-'} C, {hbm}")
        for device, port in (facts.network or {}).items():
            lines.append(f"  NPU network port {device}: {port.ip or '-'}, link {port.link or '-'}, "
                         f"health {port.net_health or '-'}, TLS {'-' if port.tls_switch is None else port.tls_switch}")
    if facts.disk_free_bytes is not None:
        lines.append(f"checkpoint disk: {facts.disk_free_bytes / GB:.1f} GB free at {facts.disk_path}")
    return "\n".join(lines)


class Doctor(SubCommand):
    name = "doctor"
    help = "check this node as every job's preflight does (NPUs, CANN, driver, versions, disk)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", help="job config (YAML) whose expectations to check this node against")
        parser.add_argument("--json", action="store_true", help="machine-readable output: facts, failures, warnings")

    def run(self, args: argparse.Namespace) -> int:
        expect = expectations(args.config)
        facts = collect_facts(expect, node_rank=0)
        findings = node_findings(facts, expect)
        if args.json:
            print(json.dumps({"facts": facts.to_json(), **{
                key: [asdict(f) for f in findings if f.severity == severity]
                for key, severity in (("failures", FAIL), ("warnings", WARN))}}, indent=1))
        else:
            print(describe(facts))
            print(f"\n{format_table(findings)}" if findings else "all checks passed")
        return ExitCode.PREFLIGHT if failures(findings) else 0
