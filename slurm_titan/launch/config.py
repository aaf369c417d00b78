"""The job config: one YAML file, validated completely before anything is submitted.

Sections map to dataclasses (torchtitan style). Every error names the file, the key and what
is wrong, as a `ConfigError` (exit code 2).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from slurm_titan.cpulist import parse_cpu_list
from slurm_titan.errors import ConfigError
from slurm_titan.launch.npu_env import NpuJob, NpuSpec, check_npu
from slurm_titan.node.budgets import WATCHDOG_MARGIN_S, WatchdogSpec
from slurm_titan.node.notify_config import NotifySpec, check_notify
from slurm_titan.node.spec import CheckpointSpec
from slurm_titan.node.straggler_config import StragglerSpec, check_straggler
from slurm_titan.records.run_registry import name_problem
from slurm_titan.slurm import time_limit_minutes

DeviceKind = Literal["npu", "cpu", "cuda"]
ActivationCheckpoint = Literal["selective", "full", "memory-budget", "none"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GRES_ITEM = re.compile(r"^([a-z][a-z0-9_]*)(?::[A-Za-z][A-Za-z0-9_.-]*)?(?::([1-9][0-9]*))?$")
AUTO_GRES = "auto"
_MOVED = {
    "environment.npu.connect_timeout_s": "timeouts.startup_s (HCCL_CONNECT_TIMEOUT is derived from it)",
    "environment.npu.exec_timeout_s": "timeouts.collective_s (HCCL_EXEC_TIMEOUT is derived from it)",
}
"""Keys that moved: refused with a pointer, never silently ignored."""
_REMOVED = {
    "environment.npu.multi_stream_memory_reserve": "torch_npu 2.14.0 does not read MULTI_STREAM_MEMORY_RESERVE",
}
"""Keys that went away: refused with the reason."""


@dataclass
class SlurmSpec:
    """Resources and scheduling. `extra` passes any other sbatch option through (`{"mem-per-cpu": "2G"}`).

    `gres` becomes sbatch `--gres`: "auto" (the default) asks for `npu:<devices_per_node>` in NPU jobs and
    nothing otherwise (sites that constrain devices by cgroup give a job without it no /dev/davinci*); "none" or
    null asks for nothing; any other value (`npu:16`, `gpu:8`, `gpu:a100:4,shard:2`) is passed as it is.
    `spare_nodes` more nodes wait idle for a node to leave out. `keep_allocation_on_node_loss` (on by default)
    submits with `--no-kill`: a lost node then leaves the allocation, which goes on (with a spare) without a
    trip through the queue; a lost batch host is seen by the surviving supervisors, which requeue the job
    (node.supervisor.batch_host). Off: Slurm ends the job on a lost node and requeues it, spares or not.
    """

    nodes: int = 1
    devices_per_node: int = 1
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    exclusive: bool = False
    cpus_per_node: int | None = None
    mem: str | None = None
    port_window: list[int] = field(default_factory=lambda: [20000, 29999])
    spare_nodes: int = 0
    keep_allocation_on_node_loss: bool = True
    gres: str | None = AUTO_GRES
    extra: dict[str, Any] = field(default_factory=dict)

    def gres_request(self, device: str) -> str | None:
        """The `--gres` value this job asks for, None for none."""
        if self.gres == AUTO_GRES:
            return f"npu:{self.devices_per_node}" if device == "npu" else None
        return None if self.gres in (None, "none") else self.gres


@dataclass
class TorchtitanSpec:
    """What torchtitan runs: `--module`, `--config`, any of its options, overrides to import.

    `args` is a nested mapping of torchtitan options: `{training: {steps: 20}}` -> `--training.steps 20`.
    `debug_assets`, when set, is a folder where slurm-titan generates a tiny tokenizer and dataset
    and points `hf_assets_path` / `dataloader.dataset_path` at them (no hub needed).
    """

    module: str = "llama3"
    config: str = "llama3_debugmodel"
    args: dict[str, Any] = field(default_factory=dict)
    override_imports: list[str] = field(default_factory=list)
    activation_checkpoint: ActivationCheckpoint | None = None
    debug_assets: str | None = None

    def option(self, dotted: str, default: Any = None) -> Any:
        """The value `args` gives torchtitan option `dotted` (`"comm.trace_buf_size"`), or `default`."""
        node: Any = self.args
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


@dataclass
class EnvironmentSpec:
    """How each node is prepared: device kind, shell set-up lines, extra environment variables."""

    device: DeviceKind = "npu"
    python: str | None = None
    workdir: str | None = None
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    npu: NpuSpec = field(default_factory=NpuSpec)


@dataclass
class PreemptionSpec:
    """Retry policy: the warning signal comes `signal_seconds` before the time limit (time for a
    checkpoint and its upload); requeues are capped by `max_requeues`; failed attempts are retried
    (inside the allocation when it can) up to `max_failures` over the run, and the run ends as a
    restart loop after `max_failures_without_progress` failures in a row that trained no new step.
    With `allow_shrink`, a run whose allocation has too few good nodes left goes on inside it on fewer
    (down to `min_nodes`, default 1, at node counts whose world size the parallelism divides) instead
    of requeueing; DCP reshards model and optimizer. With `standby_step`, each attempt's next step is started on
    the same nodes as soon as it trained its first step, its ranks imported (torch, torchtitan, torch_npu) and
    waiting, so that a restart after a failure does not wait for the import (node.batch.ahead); it costs each node
    one imported process per rank in host memory, and host CPU for the import beside the training. Off, the next
    step is started ahead only once a failure is seen."""

    signal_seconds: int = 300
    max_requeues: int = 20
    max_failures: int = 20
    max_failures_without_progress: int = 3
    allow_shrink: bool = False
    min_nodes: int | None = None
    standby_step: bool = False


@dataclass
class TimeoutSpec:
    """How long ranks wait for each other: `startup_s` from process-group creation to the end of the first
    step (rendezvous, communicator set-up, every node's checkpoint restore and load), `collective_s` for one
    collective after that (it must outlast the longest stall of one rank while the others wait, such as a
    synchronous checkpoint save: a 70B checkpoint is ~850 GB, ~106 GB per node on 8 nodes).

    Derived together, in this order of firing: slurm-titan's progress watchdog (`watchdog`, below) first, so
    that the ranks' stacks are taken while every rank still exists; then torch's process-group watchdog (torchtitan's
    `comm.init_timeout_seconds` = startup_s, then `comm.train_timeout_seconds` = collective_s) fires first and,
    on NPU, dumps HCCL's flight recorder (TORCH_HCCL_DUMP_ON_TIMEOUT) and tears the process down;
    HCCL_EXEC_TIMEOUT, the device-side wait, is max(startup_s, collective_s) + 120 s, so it fires only if the
    watchdog did not. HCCL_CONNECT_TIMEOUT (link set-up, within CANN's [120, 7200]) is startup_s: a node late
    by up to the start-up budget still connects. torch_npu's TORCH_HCCL_ASYNC_ERROR_HANDLING page suggests the
    opposite order (HCCL's own timeout error first, for its diagnosis); the flight recorder's per-rank record of
    the pending collective is what a hang needs, hence this order. On NPU startup_s may not be 1800 s:
    ProcessGroupHCCL takes its own default timeout (30 min) for unset and replaces it with HCCL_EXEC_TIMEOUT +
    1800 s, which would reverse the order at start-up (npu_env.HCCL_PG_DEFAULT_TIMEOUT_S); hence 1790.
    """

    startup_s: int = 1790
    collective_s: int = 1200


@dataclass
class DoctorSpec:
    """`doctor`: what the preflight checks besides its defaults. `check_kernels` (NPU jobs only) runs the quick
    checks of `slurm-titan check-overrides --device npu` on one NPU of every node before training (minutes: the
    model-sized cases' references are computed on the host); a failed check fails the preflight (exit 78)."""

    check_kernels: bool = False


@dataclass
class JobConfig:
    """A whole job: name, where its run folders go, the run it belongs to (launch.run_binding: `--run`), and the
    sections above."""

    name: str
    runs_dir: str = "runs"
    run: str | None = None
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    torchtitan: TorchtitanSpec = field(default_factory=TorchtitanSpec)
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    preemption: PreemptionSpec = field(default_factory=PreemptionSpec)
    timeouts: TimeoutSpec = field(default_factory=TimeoutSpec)
    notify: NotifySpec = field(default_factory=NotifySpec)
    watchdog: WatchdogSpec = field(default_factory=WatchdogSpec)
    straggler: StragglerSpec = field(default_factory=StragglerSpec)
    doctor: DoctorSpec = field(default_factory=DoctorSpec)
    source: str = field(default="<memory>", compare=False, repr=False)

    def npu_job(self) -> NpuJob:
        """What `npu_env` needs of this job besides `environment.npu`."""
        slurm, timeouts = self.slurm, self.timeouts
        return NpuJob(where=self.source, nodes=slurm.nodes, devices_per_node=slurm.devices_per_node,
                      port_window=(slurm.port_window[0], slurm.port_window[1]), startup_s=timeouts.startup_s,
                      collective_s=timeouts.collective_s, env=self.environment.env,
                      upload_cpus=self.checkpoint.upload_cpus, titan_option=self.torchtitan.option,
                      cpus_per_node=slurm.cpus_per_node)


# ---- loading -----------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(tp))
    if origin is not None:
        return origin.__name__
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str, key: str) -> Any:
    """Check `value` against the annotation `tp`; build nested dataclasses."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, where, key)
            except ConfigError:
                continue
        raise ConfigError(where, key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(where, key, f"must be one of {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return _build(tp, value, where, key)
    elif origin is list:
        if isinstance(value, list):
            (item_type,) = typing.get_args(tp)
            return [_coerce(item, item_type, where, f"{key}[{index}]") for index, item in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            _, value_type = typing.get_args(tp)
            return {str(k): _coerce(v, value_type, where, f"{key}.{k}") for k, v in value.items()}
    elif tp is Any:
        return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(where, key, f"expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: dict[str, Any], where: str, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "source"}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path in _MOVED:
            raise ConfigError(where, path, f"moved: set {_MOVED[path]}")
        if path in _REMOVED:
            raise ConfigError(where, path, f"removed: {_REMOVED[path]}; delete the key")
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
            raise ConfigError(where, path, f"unknown key{hint}")
        kwargs[key] = _coerce(value, hints[key], where, path)
    missing = [name for name, f in known.items()
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in kwargs]
    if missing:
        raise ConfigError(where, f"{prefix}.{missing[0]}" if prefix else missing[0], "is required")
    return cls(**kwargs)


def _validate(config: JobConfig) -> None:
    where = config.source
    if not _NAME.match(config.name):
        raise ConfigError(where, "name", f"{config.name!r} must be letters, digits, '.', '_' or '-'")
    if config.run is not None and (problem := name_problem(config.run)):
        raise ConfigError(where, "run", problem)
    slurm = config.slurm
    if slurm.nodes < 1:
        raise ConfigError(where, "slurm.nodes", f"must be >= 1, got {slurm.nodes}")
    if slurm.devices_per_node < 1:
        raise ConfigError(where, "slurm.devices_per_node", f"must be >= 1, got {slurm.devices_per_node}")
    try:
        time_limit_minutes(slurm.time)
    except ValueError as error:
        raise ConfigError(where, "slurm.time", str(error)) from None
    window = slurm.port_window
    if len(window) != 2 or not 1024 <= window[0] <= window[1] <= 65535:
        raise ConfigError(where, "slurm.port_window", f"must be [low, high] within 1024..65535, got {window}")
    for key in ("signal_seconds", "max_requeues", "max_failures"):
        if getattr(config.preemption, key) < 0:
            raise ConfigError(where, f"preemption.{key}", f"must be >= 0, got {getattr(config.preemption, key)}")
    if config.preemption.max_failures_without_progress < 1:
        raise ConfigError(where, "preemption.max_failures_without_progress",
                          f"must be >= 1, got {config.preemption.max_failures_without_progress}")
    min_nodes = config.preemption.min_nodes
    if min_nodes is not None and not 1 <= min_nodes <= slurm.nodes:
        raise ConfigError(where, "preemption.min_nodes",
                          f"must be within 1..slurm.nodes={slurm.nodes}, got {min_nodes}")
    if slurm.spare_nodes < 0:
        raise ConfigError(where, "slurm.spare_nodes", f"must be >= 0, got {slurm.spare_nodes}")
    if config.preemption.signal_seconds >= time_limit_minutes(slurm.time) * 60:
        raise ConfigError(where, "preemption.signal_seconds",
                          f"{config.preemption.signal_seconds} s is not shorter than slurm.time {slurm.time}")
    for key in ("keep_local", "keep_remote", "keep_every"):
        if getattr(config.checkpoint, key) < 0:
            raise ConfigError(where, f"checkpoint.{key}", f"must be >= 0, got {getattr(config.checkpoint, key)}")
    if config.checkpoint.remote and not config.checkpoint.enable:
        raise ConfigError(where, "checkpoint.remote", "is set but checkpoint.enable is false")
    if config.checkpoint.remote:
        _check_remote(where, config.checkpoint.remote)
    if config.checkpoint.upload_cpus is not None:
        try:
            parse_cpu_list(config.checkpoint.upload_cpus)
        except ValueError as error:
            raise ConfigError(where, "checkpoint.upload_cpus", str(error)) from None
    if not config.checkpoint.upload_rate >= 0:
        raise ConfigError(where, "checkpoint.upload_rate", f"must be >= 0, got {config.checkpoint.upload_rate}")
    if config.checkpoint.interval < 1:
        raise ConfigError(where, "checkpoint.interval", f"must be >= 1, got {config.checkpoint.interval}")
    memory = config.checkpoint.memory
    if memory.interval != "auto" and memory.interval < 1:
        raise ConfigError(where, "checkpoint.memory.interval", f"must be >= 1 or auto, got {memory.interval}")
    if memory.enable and not config.checkpoint.remote:
        raise ConfigError(where, "checkpoint.memory.enable",
                          "the RAM tier stands in front of the store: set checkpoint.remote too")
    if memory.enable and not Path(memory.dir).is_absolute():
        raise ConfigError(where, "checkpoint.memory.dir", f"must be an absolute path, got {memory.dir!r}")
    if config.checkpoint.expected_size_gb is not None and config.checkpoint.expected_size_gb < 1:
        raise ConfigError(where, "checkpoint.expected_size_gb",
                          f"must be >= 1, got {config.checkpoint.expected_size_gb}")
    _check_gres(config)
    check_notify(where, config.notify, config.environment.env)
    for key in ("startup_s", "collective_s"):
        if getattr(config.timeouts, key) < 1:
            raise ConfigError(where, f"timeouts.{key}", f"must be >= 1, got {getattr(config.timeouts, key)}")
    for option in ("comm.init_timeout_seconds", "comm.train_timeout_seconds"):
        if config.torchtitan.option(option) is not None:
            raise ConfigError(where, f"torchtitan.args.{option}", "comes from the timeouts section; set it there")
    if config.environment.device == "npu":
        check_npu(config.environment.npu, config.npu_job())
        _check_npu_torchtitan(config)
    elif config.doctor.check_kernels:
        raise ConfigError(where, "doctor.check_kernels", "checks the NPU kernels: needs environment.device: npu")
    _check_watchdog(config)
    check_straggler(where, config.straggler, slurm.spare_nodes)
    for key in ("module", "config"):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", getattr(config.torchtitan, key)):
            raise ConfigError(where, f"torchtitan.{key}", f"{getattr(config.torchtitan, key)!r} is not a Python name")


_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "oss", "tos", "az", "abfs"})


def _check_remote(where: str, remote: str) -> None:
    """Each `proto://` of `remote` (fsspec chains them with `::`) must be one fsspec knows
    (`fsspec.available_protocols()`: its registry of implementations, none imported here), and an
    object store's URL must name a bucket."""
    from fsspec import available_protocols

    for part in remote.split("::"):
        protocol, sep, rest = part.partition("://")
        if not sep:
            continue
        if protocol.lower() not in available_protocols():
            raise ConfigError(where, "checkpoint.remote",
                              f"{remote!r}: unknown protocol {protocol + '://'!r} "
                              "(fsspec knows s3://, gs://, file://, ...; or give a shared path)")
        if protocol.lower() in _BUCKET_PROTOCOLS and not rest.split("/", 1)[0]:
            raise ConfigError(where, "checkpoint.remote", f"{remote!r} names no bucket: write {protocol}://BUCKET/prefix")


_WATCHDOG_LIMITS = {"startup_s": "startup_s", "restore_s": "startup_s", "first_step_s": "startup_s",
                    "step_floor_s": "collective_s", "save_s": "collective_s"}
"""Each watchdog budget and the torch timeout (a `timeouts` key) its peers wait under meanwhile."""


def _check_watchdog(config: JobConfig) -> None:
    """Positive budgets that end before the torch timeouts (see WatchdogSpec); with the watchdog off and
    timeouts that outlast the job, one warning: a hang then holds the nodes until the time limit."""
    where, watchdog, timeouts = config.source, config.watchdog, config.timeouts
    for field_ in dataclasses.fields(WatchdogSpec):
        value = getattr(watchdog, field_.name)
        if field_.name != "enable" and value < 1:
            raise ConfigError(where, f"watchdog.{field_.name}", f"must be >= 1, got {value}")
    if watchdog.enable and not config.checkpoint.enable:
        print(f"slurm-titan: WARNING: {where}: checkpoint.enable is false: the ranks report their steps from the "
              "checkpoint hook, so this job has no progress watchdog and no per-attempt step history", file=sys.stderr)
    if not watchdog.enable:
        limit_s = time_limit_minutes(config.slurm.time) * 60
        longest = max(timeouts.startup_s, timeouts.collective_s)
        if longest >= limit_s:
            print(f"slurm-titan: WARNING: {where}: watchdog.enable is false and timeouts ({longest} s) outlast "
                  f"slurm.time {config.slurm.time}: a hang holds the nodes until the time limit", file=sys.stderr)
        return
    for key, timeout_key in _WATCHDOG_LIMITS.items():
        budget, timeout = getattr(watchdog, key), getattr(timeouts, timeout_key)
        if budget + WATCHDOG_MARGIN_S > timeout:
            raise ConfigError(where, f"watchdog.{key}",
                              f"{budget} s must end {WATCHDOG_MARGIN_S} s before timeouts.{timeout_key} ({timeout} s), "
                              "so that the watchdog takes the stacks before torch's timeout kills the ranks")


def _check_gres(config: JobConfig) -> None:
    where, slurm = config.source, config.slurm
    if "gres" in slurm.extra:
        raise ConfigError(where, "slurm.extra.gres", "set slurm.gres instead (default: npu:<devices_per_node> "
                                                     "for NPU jobs)")
    request = slurm.gres_request(config.environment.device)
    if request is None:
        return
    for item in request.split(","):
        match = _GRES_ITEM.match(item)
        if not match:
            raise ConfigError(where, "slurm.gres", f"{item!r} in {request!r} is not name[:type][:count] "
                                                   "(Slurm --gres), e.g. 'npu:8'")
        if match[1] == "npu" and match[2] and int(match[2]) < slurm.devices_per_node:
            raise ConfigError(where, "slurm.gres", f"{request!r} gives each node {match[2]} NPUs but "
                                                   f"slurm.devices_per_node is {slurm.devices_per_node}")


NPU_SPMD_BACKEND = "spmd_types"
"""The only `parallelism.spmd_backend` the NPU overrides run under: the others (partial_dtensor, full_dtensor)
hand the RoPE and attention DTensors (torchtitan llama3/parallelize.py)."""


def _check_npu_torchtitan(config: JobConfig) -> None:
    """What the NPU overrides cannot run: refused before submitting (torchtitan's own checks pass them)."""
    where, titan = config.source, config.torchtitan
    degree = titan.option("parallelism.context_parallel_degree", 1)
    if isinstance(degree, int) and degree > 1:
        raise ConfigError(where, "torchtitan.args.parallelism.context_parallel_degree",
                          f"{degree}: the NPU attention (npu_fusion_attention, TND varlen) has no context-parallel "
                          "path, and torchtitan's own check runs before the override; use 1 on NPU")
    backend = titan.option("parallelism.spmd_backend", NPU_SPMD_BACKEND)
    if backend != NPU_SPMD_BACKEND:
        raise ConfigError(where, "torchtitan.args.parallelism.spmd_backend",
                          f"{backend!r} hands the NPU RoPE and attention DTensors, whose fallbacks run complex "
                          f"index/gather on the device and the slow reference attention; use {NPU_SPMD_BACKEND!r} "
                          "(torchtitan's default) on NPU")
    if titan.option("compile.enable") is True:
        raise ConfigError(where, "torchtitan.args.compile.enable",
                          "torch.compile needs triton-ascend, which the npu extra does not install, and "
                          "npu_fusion_attention has no graph mode (torch_npu docs); leave it off on NPU")


def _set_path(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    node = data
    parts = dotted.split(".")
    for index, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(where, ".".join(parts[: index + 1]), "is not a section; cannot set a key inside it")
        node = child
    node[parts[-1]] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key.path=value` with the value read as YAML (`3`, `true`, `[a, b]`, `text`)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or not re.match(r"^[A-Za-z0-9_.-]+$", key):
        raise ConfigError("--set", None, f"{text!r} is not KEY.PATH=VALUE")
    return key, yaml.safe_load(raw) if raw else ""


def load_config(path: str | Path, overrides: Sequence[tuple[str, Any]] = ()) -> JobConfig:
    """Read, override (`--set`, `--nodes`, ...) and validate a job config; ConfigError on any problem."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(where, None, "config file not found") from None
    except OSError as error:
        raise ConfigError(where, None, f"cannot read: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise ConfigError(where, None, f"{line}invalid YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(where, None, "must be a YAML mapping of sections")
    for key, value in overrides:
        _set_path(data, key, value, f"{where} (--set {key})")
    config = _build(JobConfig, data, where, "")
    config.source = where
    _validate(config)
    return config
