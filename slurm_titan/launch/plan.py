"""Plan a job from its config: the sbatch script (made by submitit) and what every node runs.

Planning is separate from submitting (torchx style): `plan_job` touches no cluster and writes
nothing; `str(plan)` is the exact sbatch script plus the command each node runs, which is what
`submit --dry-run` prints.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from submitit.slurm.slurm import _make_sbatch_string

from slurm_titan import envvars, titan_configs
from slurm_titan.data.token_names import TOKEN_SHARDS_DATASET
from slurm_titan.errors import ConfigError
from slurm_titan.launch import npu_env
from slurm_titan.launch.config import CheckpointSpec, JobConfig, TorchtitanSpec
from slurm_titan.launch.config_digest import config_digest
from slurm_titan.launch.preflight import preflight_expectations
from slurm_titan.launch.templating import export_lines, render
from slurm_titan.node.batch_spec import BatchSpec, LeasePlan, RetryPolicy
from slurm_titan.node.budgets import Budgets
from slurm_titan.node.notify_config import submit_warnings
from slurm_titan.node.spec import CheckpointPlan, NodeSpec
from slurm_titan.node.straggler_config import StragglerPlan
from slurm_titan.records import jobs, run_folder, run_registry
from slurm_titan.records.run_folder import JOB_DIR, JOB_ID, SLURM_JOB_ID
from slurm_titan.records.slow_nodes import OFF
from slurm_titan.signals import STOP_SIGNALS
from slurm_titan.slurm import time_limit_minutes

RANK_ENTRY = "slurm_titan.rank.entry"
HOLD_SIGNALS_VAR = "hold_stop_signals"  # set by the node set-up template, used on the srun line
STEP_NODES = f"--nodes=${envvars.NUM_NODES} --ntasks=${envvars.NUM_NODES} --nodelist=${envvars.NODES} --overlap"
"""srun options on the srun line: each attempt runs on the nodes the batch shell chose (spares left out);
`--overlap` because the step of a lost node never completes (the node cannot confirm it) and would keep
the surviving nodes' CPUs from the next attempt ("Requested nodes are busy")."""
_PATH_OPTIONS = ("hf_assets_path", "dataloader.dataset_path")
_BASE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    """A job ready to submit: submitit's folder and parameters (the sbatch script's set-up writes `batch` into the
    job folder), and the node spec."""

    config: JobConfig
    folder: str
    python: str
    parameters: dict[str, Any]
    node: NodeSpec
    batch: BatchSpec
    node_prefix: str = ""

    @property
    def launcher(self) -> str:
        """What follows srun's own options on submitit's srun line: the attempt's nodes (srun options,
        see slurm_titan.node.batch.allocation), then the Python, behind the set-up's hold on Slurm's warning
        signals (see slurm_titan.rank.preemption) and `node_prefix`, which runs on each node first (NPU
        jobs: CANN's set_env.sh, see npu_env.cann_launcher; the signals stay blocked through it)."""
        return f"{STEP_NODES} ${HOLD_SIGNALS_VAR} {self.node_prefix}{shlex.quote(self.python)}"

    @property
    def submitit_command(self) -> str:
        """The command submitit puts after `srun` (same text as SlurmExecutor._submitit_command_str)."""
        return " ".join([self.launcher, "-u -m submitit.core._submit", shlex.quote(self.folder)])

    def script(self) -> str:
        """The exact sbatch script submitit writes for this plan."""
        return _make_sbatch_string(command=self.submitit_command, folder=self.folder, **self.parameters)

    def with_spares(self, spares: int) -> JobPlan:
        """The same plan allocating `spares` spare nodes beside `slurm.nodes`."""
        return replace(self, parameters=self.parameters | {"nodes": self.config.slurm.nodes + spares})

    def excluding(self, hosts: list[str]) -> JobPlan:
        """The same plan keeping the job off `hosts` (sbatch --exclude)."""
        extra = self.parameters["additional_parameters"] | {"exclude": ",".join(hosts)}
        return replace(self, parameters=self.parameters | {"additional_parameters": extra})

    def node_command(self) -> str:
        """What every node's supervisor starts for each of its devices."""
        return shlex.join(self.node.rank_argv)

    def __str__(self) -> str:
        return (
            f"# ---- sbatch script ({run_folder.submission_script(Path(self.folder), SLURM_JOB_ID)}) ----\n"
            f"{self.script()}\n"
            f"# ---- on each of {self.config.slurm.nodes} node(s): {self.node.procs_per_node} process(es), "
            f"RANK = node's place in {envvars.NODES} * {self.node.procs_per_node} + LOCAL_RANK ----\n"
            f"{self.node_command()}\n"
        )


def _flag(path: str) -> str:
    return "--" + path.replace("_", "-")


def flatten_options(options: dict[str, Any], prefix: str = "") -> list[str]:
    """`{training: {steps: 20, compile: false}}` -> `--training.steps 20 --training.no-compile` (tyro's flags)."""
    argv: list[str] = []
    for key, value in options.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            argv += flatten_options(value, path)
        elif value is True:
            argv.append(_flag(path))
        elif value is False:
            head, _, leaf = path.rpartition(".")
            argv.append(_flag(f"{head}.no-{leaf}" if head else f"no-{leaf}"))
        elif isinstance(value, list):
            argv += [_flag(path), *(str(item) for item in value)]
        else:
            argv += [_flag(path), str(value)]
    return argv


def _check_torchtitan(config: JobConfig) -> None:
    titan = config.torchtitan
    functions = titan_configs.config_functions(titan.module)
    if functions is not None and titan.config not in functions:
        raise ConfigError(config.source, "torchtitan.config",
                          f"torchtitan module {titan.module!r} has no config {titan.config!r}")
    for option in _PATH_OPTIONS:
        value = titan.option(option)
        if value is not None and "://" not in str(value) and not Path(str(value)).exists():  # URLs: the ranks open them
            raise ConfigError(config.source, f"torchtitan.args.{option}", f"{value}: no such file or directory")


DUMP_FOLDER = str(run_folder.dump_folder(Path(JOB_DIR)))
NPU_DEFAULTS = {"training.disable_cuda_graphs": True, "compile.enable": False}
"""What NPU jobs pass unless `torchtitan.args` says otherwise. disable_cuda_graphs: torchtitan's
`zero_grad(set_to_none=training.disable_cuda_graphs)` otherwise keeps the fp32 gradients allocated through
the next forward (CUDA graphs do not exist on NPU). compile off: a config function may enable it (llama3_405b),
and torch.compile cannot run on NPU here (config._check_npu_torchtitan)."""


def _flags(values: dict[str, Any]) -> list[str]:
    """`{"a.b_c": 1}` -> `--a.b-c 1` (see flatten_options)."""
    nested: dict[str, Any] = {}
    for dotted, value in values.items():
        head, _, leaf = dotted.rpartition(".")
        node = nested
        for part in filter(None, head.split(".")):
            node = node.setdefault(part, {})
        node[leaf] = value
    return flatten_options(nested)


def _titan_options(config: JobConfig, override_imports: list[str]) -> list[str]:
    titan, ckpt = config.torchtitan, config.checkpoint
    options: dict[str, Any] = {"dump_folder": DUMP_FOLDER,
                               "comm": {"init_timeout_seconds": config.timeouts.startup_s,
                                        "train_timeout_seconds": config.timeouts.collective_s}}
    if titan.debug_assets:
        assets = Path(titan.debug_assets).absolute()
        options |= {"hf_assets_path": str(assets / "tokenizer"),
                    "dataloader": {"dataset_path": str(assets / "dataset")}}
    argv = ["--module", titan.module, "--config", titan.config, *flatten_options(options), *flatten_options(titan.args)]
    if config.environment.device == "npu":
        argv += _flags({key: value for key, value in NPU_DEFAULTS.items() if titan.option(key) is None})
    if ckpt.enable:
        argv += flatten_options({"checkpoint": {"enable": True, "interval": ckpt.interval,
                                                "folder": _checkpoint_local(config),
                                                "last_save_model_only": False}})
    if override_imports:  # targets with kwargs (`target={json}`) are tokens of their own (parse_cli_imports)
        argv += ["--override.imports", ",".join(o for o in override_imports if "=" not in o),
                 *(o for o in override_imports if "=" in o)]
    if titan.activation_checkpoint:  # a tyro subcommand: must come last
        argv.append(f"activation-checkpoint:{titan.activation_checkpoint}")
    return argv


CHECKPOINT_OVERRIDE = "slurm_titan.rank.checkpointer.synced_checkpoints"
METRICS_OVERRIDE = "slurm_titan.overrides.titan_metrics.continuous_metrics"


def _data_overrides(ckpt: CheckpointSpec, titan: TorchtitanSpec | None = None) -> list[str]:
    """The token-shard data loader when `dataloader.dataset` is `token_shards` (whether checkpoints are on or
    not: torchtitan's loader cannot read them); else the resharding data loader when checkpoints are on, unless
    `on_world_size_change: restart_data`."""
    from slurm_titan.overrides import RESHARDING_DATALOADER, TOKEN_SHARD_DATALOADER

    restart = ckpt.on_world_size_change == "restart_data"
    if titan is not None and titan.option("dataloader.dataset") == TOKEN_SHARDS_DATASET:
        kwargs = {key: True for key, on in (("allow_dataset_change", ckpt.allow_dataset_change),
                                            ("restart_data", restart)) if on}
        return [f"{TOKEN_SHARD_DATALOADER}={json.dumps(kwargs)}" if kwargs else TOKEN_SHARD_DATALOADER]
    if not ckpt.enable or restart:
        return []
    return [f'{RESHARDING_DATALOADER}={{"allow_dataset_change": true}}' if ckpt.allow_dataset_change
            else RESHARDING_DATALOADER]


def default_overrides(config: JobConfig) -> list[str]:
    """The project's overrides every job activates: device kernels, the checkpoint hook
    (background upload + commit, coordinated save on preemption), the token-shard data loader for a
    `token_shards` dataset or else the resharding data loader when checkpointing is on, and one metrics run
    across attempts when TensorBoard or W&B is on (slurm_titan.overrides.titan_metrics)."""
    from slurm_titan.overrides import DEFAULT_CPU_OVERRIDES, DEFAULT_NPU_OVERRIDES

    device = config.environment.device
    kernels = list({"npu": DEFAULT_NPU_OVERRIDES, "cpu": DEFAULT_CPU_OVERRIDES}.get(device, ()))
    metrics = any(config.torchtitan.option(f"metrics.enable_{sink}") for sink in ("tensorboard", "wandb"))
    return (kernels + ([CHECKPOINT_OVERRIDE] if config.checkpoint.enable else [])
            + _data_overrides(config.checkpoint, config.torchtitan) + ([METRICS_OVERRIDE] if metrics else []))


def _checkpoint_local(config: JobConfig) -> str:
    return config.checkpoint.planned_local(config.name)


def _checkpoint_plan(config: JobConfig) -> CheckpointPlan | None:
    ckpt = config.checkpoint
    if not ckpt.enable:
        return None
    return CheckpointPlan.from_spec(ckpt, name=config.name, config_digest=config_digest(config),
                                    reshards_data=bool(_data_overrides(ckpt)))


def _watchdog_budgets(config: JobConfig) -> Budgets | None:
    """The watchdog's budgets, when it is on: the ranks tell their progress from the checkpoint hook, so
    a job without checkpoints has no watchdog (its hangs end at the torch timeouts)."""
    watchdog = config.watchdog
    if not (watchdog.enable and config.checkpoint.enable):
        return None
    return Budgets.from_spec(watchdog, config.timeouts.collective_s)


def _straggler_plan(config: JobConfig) -> StragglerPlan:
    """The slow-node judge's settings for the batch shell (BatchSpec): it needs the nodes' timing, which the ranks
    report through the watchdog's progress records, so without a watchdog (_watchdog_budgets) it is off."""
    spec = config.straggler
    action = spec.resolved_action(config.slurm.spare_nodes) if _watchdog_budgets(config) else OFF
    steps = config.torchtitan.option("training.steps")
    return StragglerPlan(action=action, threshold=spec.threshold, window_steps=spec.window_steps,
                         warmup_steps=spec.warmup_steps, total_steps=steps if isinstance(steps, int) else None)


def model_parallel_degree(config: JobConfig) -> int:
    """The ranks one model replica spans (tensor x pipeline x context parallel): a world size must be a multiple."""
    degree = 1
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"):
        degree *= int(config.torchtitan.option(f"parallelism.{key}", 1) or 1)
    return degree


def shrink_node_counts(config: JobConfig) -> list[int]:
    """The node counts under `slurm.nodes` a run may go on with (`preemption.allow_shrink`), largest first:
    down to `preemption.min_nodes`, where the world size is a multiple of the model-parallel degree. A
    `min_nodes` the parallelism cannot use is one warning, and the next count it can use is the floor."""
    policy, slurm = config.preemption, config.slurm
    if not policy.allow_shrink:
        return []
    degree = model_parallel_degree(config)
    usable = [n for n in range(slurm.nodes - 1, 0, -1) if n * slurm.devices_per_node % degree == 0]
    floor = policy.min_nodes or 1
    if floor < slurm.nodes and floor not in usable:
        above = [n for n in usable if n > floor]
        print(f"slurm-titan: WARNING: {config.source}: preemption.min_nodes={floor} gives a world size of "
              f"{floor * slurm.devices_per_node}, not a multiple of the model-parallel degree {degree}; "
              + (f"shrinking stops at {min(above)} node(s)" if above else "the run will not shrink"), file=sys.stderr)
    return [n for n in usable if n >= floor]


def _lease_plan(config: JobConfig, take_over: bool) -> LeasePlan | None:
    """The writer lease the batch shell takes: of a remote location that jobs share (a run's, or one without
    `{job_id}`); a location of one job's own has no other writer to keep out."""
    ckpt = config.checkpoint
    remote = run_folder.planned(ckpt.remote, config.name) if ckpt.enable and ckpt.remote else None
    if remote is None or JOB_ID in remote:
        return None
    return LeasePlan(remote=remote, endpoint_url=ckpt.endpoint_url, take_over=take_over)


def _batch_spec(config: JobConfig, take_over: bool = False) -> BatchSpec:
    """What the batch shell's processes read of the config (node.batch_spec); `take_over`: see :func:`plan_job`."""
    policy = config.preemption
    return BatchSpec(nodes=config.slurm.nodes, shrink_to=tuple(shrink_node_counts(config)),
                     retry=RetryPolicy(max_requeues=policy.max_requeues, max_failures=policy.max_failures,
                                       max_failures_without_progress=policy.max_failures_without_progress),
                     signal_seconds=policy.signal_seconds, titan_module=config.torchtitan.module,
                     titan_config=config.torchtitan.config, straggler=_straggler_plan(config),
                     lease=_lease_plan(config, take_over),
                     memory_dir=config.checkpoint.memory.dir if config.checkpoint.memory.enable else None,
                     standby_step=policy.standby_step)


def _lease_lines(batch: BatchSpec, python: str) -> str:
    """The set-up's lines that take the writer lease and keep it while the batch shell lives (node.batch.lease);
    none without a lease."""
    if batch.lease is None:
        return ""
    lease = f'{shlex.quote(python)} -m slurm_titan.node.batch.lease --job-dir "$slurm_titan_job_dir"'
    return ("# the writer lease of the checkpoint location, before any rank writes; renewed while this shell lives\n"
            f"{lease} || exit $?\n{lease} --renew-while $$ &\n")


def _lines(template: str, **values: str) -> list[str]:
    return render(template, **values).rstrip("\n").splitlines()


def _sbatch_parameters(config: JobConfig, setup: list[str], teardown: list[str]) -> dict[str, Any]:
    slurm = config.slurm
    parameters: dict[str, Any] = {
        "job_name": config.name,
        "nodes": slurm.nodes + slurm.spare_nodes,
        "ntasks_per_node": 1,
        "time": time_limit_minutes(slurm.time),
        "setup": setup,
        "teardown": teardown,
        "stderr_to_stdout": True,
        "srun_args": ["--kill-on-bad-exit=1"],
        "signal_delay_s": config.preemption.signal_seconds,
    }
    optional = {"partition": slurm.partition, "account": slurm.account, "qos": slurm.qos,
                "cpus_per_task": slurm.cpus_per_node, "mem": slurm.mem,
                "gres": slurm.gres_request(config.environment.device)}
    parameters |= {key: value for key, value in optional.items() if value is not None}
    if slurm.exclusive:
        parameters["exclusive"] = True
    if mail_type := config.notify.mail_type():  # Slurm's own mail (sbatch --mail-type/--mail-user)
        parameters["mail_type"] = mail_type
        if config.notify.mail.user:
            parameters["mail_user"] = config.notify.mail.user
    keep = {"no_kill": True} if slurm.keep_allocation_on_node_loss else {}
    parameters["additional_parameters"] = {"requeue": True, **keep} | slurm.extra
    return parameters


def _shell_word(value: str) -> str:
    """`value` as one word of the batch script, its `{job_id}` the batch shell's own $SLURM_JOB_ID."""
    return '"$SLURM_JOB_ID"'.join(shlex.quote(part) if part else "" for part in value.split(JOB_ID))


def _exports(env: dict[str, str], unset: list[str]) -> str:
    """An `unset` line for `unset`, then `export` lines (see :func:`_shell_word`)."""
    lines = [f"unset {' '.join(unset)}" if unset else "",
             export_lines({key: value for key, value in env.items() if JOB_ID not in value})]
    lines += [f"export {key}={_shell_word(value)}" for key, value in sorted(env.items()) if JOB_ID in value]
    return "\n".join(line for line in lines if line)


def _warn_notify(config: JobConfig) -> None:
    """One warning per webhook whose URL the job may not get (its variable's value stays out of the plan)."""
    export = config.slurm.extra.get("export")
    for line in submit_warnings(config.source, config.notify, os.environ, None if export is None else str(export)):
        print(f"slurm-titan: WARNING: {line}", file=sys.stderr)


def run_env(config: JobConfig) -> dict[str, str]:
    """A job bound to a run names its TensorBoard / W&B run after the run (overrides.titan_metrics), and a later job
    of the run writes TensorBoard's events into the dump folder of the run's first job (when recorded here), so that
    TensorBoard shows the run's jobs as one run on one step axis."""
    if config.run is None:
        return {}
    known = run_registry.load(config.run)
    first = jobs.find(known.jobs[0]) if known is not None and known.jobs else None
    return {envvars.RUN: config.run} | (
        {envvars.RUN_DUMP_FOLDER: str(run_folder.dump_folder(first.folder))} if first is not None else {})


def plan_job(config: JobConfig, take_over: bool = False) -> JobPlan:
    """Check what can be checked before submitting and build the plan. Raises ConfigError. `take_over`: the job
    may take its location's writer lease from a job that Slurm does not say runs (`submit --take-over`)."""
    _check_torchtitan(config)
    env = config.environment
    python = env.python or sys.executable
    workdir = str(Path(env.workdir or ".").absolute())
    job_dir = str(run_folder.job_folder(Path(config.runs_dir).absolute(), config.name))
    overrides = default_overrides(config) + config.torchtitan.override_imports
    rank_argv = (python, "-u", "-m", RANK_ENTRY, *_titan_options(config, overrides))
    node_prefix, npu_vars = (npu_env.node_setup(env.npu, config.npu_job(), str(run_folder.dump_folder(Path(job_dir))))
                             if env.device == "npu" else ("", {}))
    node_env = (_BASE_ENV | {envvars.DEVICE: env.device} | npu_vars | config.notify.node_env() | run_env(config)
                | env.env)
    unset = npu_env.left_out(npu_vars) if env.device == "npu" else []
    _warn_notify(config)
    if line := npu_env.inherited_warning(os.environ, unset):
        print(f"slurm-titan: WARNING: {config.source}: {line}", file=sys.stderr)
    batch = _batch_spec(config, take_over)
    setup = _lines("node_setup.sh.tmpl", job_dir=_shell_word(job_dir), batch_spec=batch.to_json(),
                   batch_spec_file=_shell_word(str(run_folder.batch_spec_file(Path(job_dir)))),
                   workdir=shlex.quote(workdir), setup_lines="\n".join(env.setup),
                   lease_lines=_lease_lines(batch, python),
                   env_exports=_exports(node_env, unset), python=shlex.quote(python), hold_var=HOLD_SIGNALS_VAR,
                   stop_signals=",".join(signum.name.removeprefix("SIG") for signum in STOP_SIGNALS))
    teardown = _lines("node_teardown.sh.tmpl", python=shlex.quote(python))
    checkpoint = _checkpoint_plan(config)
    node = NodeSpec(
        name=config.name, device=env.device, procs_per_node=config.slurm.devices_per_node,
        port_window=(config.slurm.port_window[0], config.slurm.port_window[1]), job_dir=job_dir,
        rank_argv=rank_argv, checkpoint=checkpoint,
        preflight=preflight_expectations(config, checkpoint.local if checkpoint else None),
        watchdog=_watchdog_budgets(config),
    )
    folder = str(run_folder.job_folder(Path(config.runs_dir).absolute(), config.name, SLURM_JOB_ID))
    return JobPlan(config=config, folder=folder, python=python,
                   parameters=_sbatch_parameters(config, setup, teardown), node=node, batch=batch,
                   node_prefix=node_prefix)
