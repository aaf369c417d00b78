"""What the login node hands each node supervisor: submitit pickles a NodeSpec into the job.

`launch.plan` fills these in from the job config; `node.supervisor` and `node.supervisor.restore` read them on the
node, where `{job_id}` (records.run_folder.JOB_ID) is filled in. The config's `checkpoint:` section is declared
here (CheckpointSpec, loaded and validated by launch.config), beside the CheckpointPlan built from it.

The checkpoint settings cross one typed bundle per process boundary, each setting under its YAML name:
CheckpointSpec (the YAML) -> CheckpointPlan (pickled to the supervisor) -> envvars.RankCheckpointEnv (the
environment of every rank) -> ckpt.UploadSettings (one JSON line to the rank's uploader process) -> ckpt.CheckpointSync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from slurm_titan.cpulist import parse_cpu_list
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.envvars import RankCheckpointEnv
from slurm_titan.node.budgets import Budgets
from slurm_titan.records import run_folder
from slurm_titan.retention import KEEP_ALL, Retention


@dataclass
class MemorySpec:
    """The RAM tier (`checkpoint.memory`): every `interval` steps each rank snapshots its whole training state into
    its node's memory (`dir`, a tmpfs), and the node copies it to a partner node; a crash, a hang or a lost node
    inside the allocation then resumes from the newest snapshot every rank can get (slurm_titan.ram). The store stays
    the durable tier. `interval: auto` is the smallest whose snapshots cost training at most 2% of its time,
    measured by the ranks with three probe snapshots from each attempt's 4th step (the time the steps after each
    took beyond the probe's own step, at least the time it stopped training: slurm_titan.rank.ram_snapshot).
    `required: false` lets a job whose nodes lack the memory run store-only, with a warning."""

    enable: bool = False
    interval: int | Literal["auto"] = "auto"
    dir: str = "/dev/shm"
    required: bool = True


@dataclass
class CheckpointSpec:
    """Tiered checkpoints: torchtitan saves to `local` (node-local disk on a real cluster), every node
    uploads its ranks' files to `remote` (a shared path or any fsspec URL, e.g. s3://bucket/run) in
    the background, and a checkpoint counts only once its commit record is there.

    `{name}` and `{job_id}` in `local` / `remote` are filled in per job. S3 credentials come from
    the environment (AWS_ACCESS_KEY_ID, ...), never from this file. `upload_cpus` (a CPU list such
    as "48-63") gives the uploader CPUs of its own, away from the ones training uses. On NPU nodes torch_npu
    binds each rank's threads to its device's cores (CPU_AFFINITY_CONF, `environment.npu.cpu_affinity`, on by
    default): mode 1/2 splits all cores evenly over the node's NPUs unless each device gets a range, so with
    binding on the config must give every device a range that leaves the upload CPUs out (checked before
    submitting); the ranges' NUMA locality (`lscpu`, `npu-smi info -t topo`) is the user's to choose.
    `upload_rate` is the most requests a second all ranks' uploads make to the store together (S3 serves 3,500
    writes a second per prefix, then answers 503 SlowDown): each rank paces its own at an even share (0: no
    pacing).

    Resuming on another node count reshards the data position too (`on_world_size_change: reshard`, the
    resharding data loader: no sample repeated or skipped); `restart_data` is the old behaviour (torchtitan's
    loader, whose data then restarts from the beginning). The dataset's fingerprint is in the checkpoint:
    resuming on another dataset is refused unless `allow_dataset_change` is true.
    """

    enable: bool = False
    interval: int = 500
    local: str | None = None
    remote: str | None = None
    endpoint_url: str | None = None
    keep_local: int = 2
    keep_remote: int = 0
    keep_every: int = 0
    upload_cpus: str | None = None
    upload_rate: float = 3500.0
    expected_size_gb: int | None = None
    on_world_size_change: Literal["reshard", "restart_data"] = "reshard"
    allow_dataset_change: bool = False
    memory: MemorySpec = field(default_factory=MemorySpec)

    @property
    def retention(self) -> Retention:
        """`keep_local`, `keep_remote` and `keep_every` as the one value every bundle below holds."""
        return Retention(keep_local=self.keep_local, keep_remote=self.keep_remote, keep_every=self.keep_every)

    def planned_local(self, name: str) -> str:
        """`local` as planned for the job `name` (default: the job folder's checkpoint folder); `{job_id}` and
        `{job_dir}` are left for the node."""
        if self.local:
            return run_folder.planned(self.local, name)
        return str(run_folder.default_checkpoint_folder(Path(run_folder.JOB_DIR)))


@dataclass(frozen=True)
class MemoryPlan:
    """The RAM tier as the supervisors run it (`checkpoint.memory`; `interval` 0: auto)."""

    interval: int
    dir: str
    required: bool = True


@dataclass(frozen=True, kw_only=True)
class CheckpointPlan:
    """Where a job's checkpoints live and what the uploader keeps (the `checkpoint:` settings of the same
    names); `{job_id}` is filled in on the node."""

    local: str
    remote: str | None = None
    endpoint_url: str | None = None
    retention: Retention = KEEP_ALL
    upload_cpus: frozenset[int] | None = None  # None: training's CPUs
    upload_rate: float = 0.0  # 0: unpaced
    config_digest: str = ""
    reshards_data: bool = False  # the resharding data loader is on (checkpoint.on_world_size_change: reshard)
    memory: MemoryPlan | None = None  # the RAM tier (checkpoint.memory), None when off

    @classmethod
    def from_spec(cls, spec: CheckpointSpec, *, name: str, config_digest: str, reshards_data: bool) -> CheckpointPlan:
        """The plan of job `name`'s checkpoints (`config_digest`: launch.config_digest)."""
        return cls(local=spec.planned_local(name),
                   remote=run_folder.planned(spec.remote, name) if spec.remote else None,
                   endpoint_url=spec.endpoint_url, retention=spec.retention,
                   upload_cpus=parse_cpu_list(spec.upload_cpus) if spec.upload_cpus else None,
                   upload_rate=spec.upload_rate, config_digest=config_digest, reshards_data=reshards_data,
                   memory=MemoryPlan(0 if spec.memory.interval == "auto" else spec.memory.interval, spec.memory.dir,
                                     spec.memory.required)
                   if spec.memory.enable else None)

    def remote_for(self, job_id: str) -> str | None:
        """The job's remote location, None without one."""
        return run_folder.fill(self.remote, job_id) if self.remote else None

    def remote_root(self) -> str | None:
        """What the remote locations of every job of the run share (the part before `{job_id}`), None without one."""
        return run_folder.before_job_id(self.remote).rstrip("/") if self.remote else None

    def rank_env(self, job_id: str) -> dict[str, str]:
        """What the checkpoint hook in every rank reads (RankCheckpointEnv; no credentials: those come from the
        environment); nothing without a remote location."""
        remote = self.remote_for(job_id)
        if not remote:
            return {}
        return RankCheckpointEnv(remote=remote, endpoint_url=self.endpoint_url, retention=self.retention,
                                 upload_cpus=self.upload_cpus, upload_rate=self.upload_rate,
                                 config_digest=self.config_digest).to_env()


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """Everything the node supervisor needs; pickled into the job by submitit."""

    name: str
    device: str
    procs_per_node: int
    port_window: tuple[int, int]
    job_dir: str
    rank_argv: tuple[str, ...]
    checkpoint: CheckpointPlan | None = None
    preflight: DoctorExpectations | None = None
    watchdog: Budgets | None = None

    def fill(self, text: str, job_id: str) -> str:
        """`text` with this job's id and folder filled in."""
        return run_folder.fill(text, job_id, self.job_dir)

    def resolve(self, job_id: str) -> tuple[Path, list[str]]:
        """This job's folder and the rank command with the job's id and folder filled in."""
        return Path(self.fill(self.job_dir, job_id)), [self.fill(arg, job_id) for arg in self.rank_argv]
