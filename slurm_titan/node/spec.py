"""What the login node hands each node supervisor: submitit pickles a NodeSpec into the job.

`launch.plan` fills these in from the job config; `node.supervisor` and `node.supervisor.restore` read them on the
node, where `{job_id}` (records.run_folder.JOB_ID) is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurm_titan.cpulist import parse_cpu_list
from slurm_titan.doctor.expectations import DoctorExpectations
from slurm_titan.envvars import RankCheckpointEnv
from slurm_titan.node.budgets import Budgets
from slurm_titan.records import run_folder


@dataclass(frozen=True, kw_only=True)
class CheckpointPlan:
    """Where a job's checkpoints live; `{job_id}` is filled in on the node."""

    local: str
    remote: str | None
    endpoint_url: str | None
    keep_local: int
    keep_remote: int
    keep_every: int
    config_digest: str
    upload_cpus: str | None = None
    reshards_data: bool = False  # the resharding data loader is on (checkpoint.on_world_size_change: reshard)

    def remote_for(self, job_id: str) -> str | None:
        """The job's remote location, None without one."""
        return run_folder.fill(self.remote, job_id) if self.remote else None

    def remote_root(self) -> str | None:
        """What the remote locations of every job of the run share (the part before `{job_id}`), None without one."""
        return run_folder.before_job_id(self.remote).rstrip("/") if self.remote else None

    def rank_env(self, job_id: str) -> dict[str, str]:
        """What the checkpoint hook in every rank reads (no credentials: those come from the environment)."""
        remote = self.remote_for(job_id)
        if not remote:
            return {}
        env = RankCheckpointEnv(remote=remote, config_digest=self.config_digest, keep_local=self.keep_local,
                                keep_remote=self.keep_remote, keep_every=self.keep_every,
                                upload_cpus=parse_cpu_list(self.upload_cpus) if self.upload_cpus else None).to_env()
        return env | ({"AWS_ENDPOINT_URL": self.endpoint_url} if self.endpoint_url else {})


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
