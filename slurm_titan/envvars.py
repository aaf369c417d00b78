"""Every `SLURM_TITAN_*` variable: the contract between the login node, the batch shell, the node
supervisors and the ranks, one name each with who writes it and who reads it.

Four hops carry them. The login node writes the sbatch script (`launch.plan`: its `export` lines run in
the batch shell); the batch shell picks each attempt's nodes (`node.batch.allocation`: eval'd `export` lines,
inherited through srun by the supervisors); each supervisor starts its ranks with a few more
(`node.supervisor`); a rank's uploader process inherits the rank's. The tuning knobs at the end are the
user's (`environment.env` in the job config, or the submitting shell): nothing of slurm-titan writes them.
Values never hold a credential (S3 keys come from the standard AWS variables).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_titan.cpulist import format_cpu_list, parse_cpu_list
from slurm_titan.errors import ConfigError
from slurm_titan.retention import KEEP_ALL, Retention

# ---- the login node -----------------------------------------------------------------------------------
HOME = "SLURM_TITAN_HOME"
"""The submitting user's: the login node's state folder (default ~/.slurm-titan); read by records.jobs (and
through it records.ledger, also in the batch shell)."""

# ---- written by the login node into the batch script ----------------------------------------------------
DEVICE = "SLURM_TITAN_DEVICE"
"""launch.plan writes the job's device kind (npu, cpu); rank.entry reads it before torchtitan is imported,
cli.doctor_cmd when run on a node without a config."""
NOTIFY = "SLURM_TITAN_NOTIFY"
"""node.notify_config writes the job's webhooks as JSON (formats, URL variable names, events: never a URL);
node.batch.notify reads it in the batch shell."""
RUN = "SLURM_TITAN_RUN"
"""launch.plan writes the name of the job's run (a job bound to one); overrides.titan_metrics names the TensorBoard
and W&B run after it, the same for every job of the run."""
RUN_DUMP_FOLDER = "SLURM_TITAN_RUN_DUMP_FOLDER"
"""launch.plan writes the dump folder of the run's first job (a later job of a run); overrides.titan_metrics writes
TensorBoard's events under it, where the run's earlier jobs wrote theirs."""

# ---- written by the batch shell for each attempt (node.batch.allocation.AttemptPlan) --------------------------
ATTEMPT_INDEX = "SLURM_TITAN_ATTEMPT_INDEX"
"""node.batch.allocation writes the attempt's number (attempts/<A>/); node.supervisor, node.batch.step_watch and
node.batch.finish read it."""
NODES = "SLURM_TITAN_NODES"
"""node.batch.allocation writes the attempt's training nodes in node-rank order (spares left out); the srun line
(launch.plan.STEP_NODES), node.supervisor.rendezvous, node.batch.step_watch and node.batch.finish read it."""
NUM_NODES = "SLURM_TITAN_NUM_NODES"
"""node.batch.allocation writes how many NODES there are; the srun line reads it."""
STARTED_AHEAD = "SLURM_TITAN_STARTED_AHEAD"
"""node.batch.ahead writes the number of the attempt it follows into the srun step it starts ahead of the batch
shell's decision; node.supervisor reads it: its ranks import, then it waits for that attempt's supervisor on its node
to end (node.supervisor.presence) and for the decision (run_folder.AHEAD_WORD)."""
STANDBY = "SLURM_TITAN_STANDBY"
"""node.batch.ahead sets it (to 1) in a standby step, started while the attempt it follows trains: its supervisor lowers
its session's scheduling group (thread_priority.lower_session_priority), its ranks import at the background priority
and, once adopted, leave for a session of their own (rank.entry); the supervisor passes it on to them."""

# ---- written by the node supervisor into each rank ---------------------------------------------------
JOB_DIR = "SLURM_TITAN_JOB_DIR"
"""node.supervisor writes the job folder (records.run_folder); rank.progress reads it (RankAttemptEnv)."""
ATTEMPT = "SLURM_TITAN_ATTEMPT"
"""node.supervisor writes the attempt id (:func:`attempt_id`); rank.progress reads its number, ckpt.upload
tags the rank's upload receipts with it (RankAttemptEnv)."""
STOP_FILE = "SLURM_TITAN_STOP_FILE"
"""node.supervisor writes where it leaves a stop signal that came before the rank could take it;
rank.preemption reads it (RankAttemptEnv)."""
PROGRESS_FILE = "SLURM_TITAN_PROGRESS_FILE"
"""node.supervisor.watchdog writes the path of the rank's progress record (node-local); records.rank_progress writes
the record there from the rank."""
STACK_FILE = "SLURM_TITAN_STACK_FILE"
"""node.supervisor.watchdog writes the node-local file of the rank's faulthandler; rank.stacks registers it."""
START_FD = "SLURM_TITAN_START_FD"
"""node.supervisor writes the pipe the rank waits at, once torch and torchtitan are imported, for the word to train
(with the environment settled after the node's preflight); rank.start_gate reads it."""
RESTORE_FD = "SLURM_TITAN_RESTORE_FD"
"""node.supervisor writes the pipe the rank waits at for the node's restore; rank.restore_gate reads it."""

# ---- the checkpoint hook's settings: node.spec.CheckpointPlan writes them (through the supervisor),
# ---- rank.checkpointer reads them (RankCheckpointEnv); each is the `checkpoint:` setting its name ends in
CKPT_REMOTE = "SLURM_TITAN_CKPT_REMOTE"
"""The remote location (URL or path) of this job's checkpoints; unset: no upload at all."""
CKPT_ENDPOINT_URL = "SLURM_TITAN_CKPT_ENDPOINT_URL"
"""The S3 endpoint of CKPT_REMOTE (checkpoint.endpoint_url; unset: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)."""
CONFIG_DIGEST = "SLURM_TITAN_CONFIG_DIGEST"
"""The digest of the torchtitan section (launch.config_digest), recorded in every commit record."""
CKPT_KEEP_LOCAL = "SLURM_TITAN_CKPT_KEEP_LOCAL"
"""Newest step folders kept on local disk (unset: torchtitan's checkpoint.keep_latest_k; 0 keeps all)."""
CKPT_KEEP_REMOTE = "SLURM_TITAN_CKPT_KEEP_REMOTE"
"""Remote retention applied by rank 0 after each commit: newest checkpoints kept (0: keep all)."""
CKPT_KEEP_EVERY = "SLURM_TITAN_CKPT_KEEP_EVERY"
"""Remote retention: every checkpoint whose step is a multiple of this is kept too (0: none)."""
CKPT_UPLOAD_CPUS = "SLURM_TITAN_CKPT_UPLOAD_CPUS"
"""CPU list the uploader process runs on (checkpoint.upload_cpus; unset: training's CPUs, at a lower priority)."""
CKPT_UPLOAD_RATE = "SLURM_TITAN_CKPT_UPLOAD_RATE"
"""Requests a second all ranks' uploads make to the store at most (checkpoint.upload_rate; unset or 0: no pacing)."""

# ---- the RAM tier's settings: node.supervisor.ram writes them, rank.ram_snapshot reads them (RamEnv) ----------
RAM_ROOT = "SLURM_TITAN_RAM_ROOT"
"""This job's snapshot folder in the node's memory (ram.layout.job_root); unset: no RAM tier."""
RAM_INTERVAL = "SLURM_TITAN_RAM_INTERVAL"
"""Steps between two RAM snapshots (checkpoint.memory.interval); 0: worked out by the ranks (auto)."""
RAM_RUN = "SLURM_TITAN_RAM_RUN"
"""What every snapshot of this run says it belongs to: the job id and the config digest (ram.snapshot.Manifest)."""

# ---- the user's tuning knobs (environment.env); read in the rank and its uploader (and the node's restore) ---
CKPT_CLOSE_TIMEOUT = "SLURM_TITAN_CKPT_CLOSE_TIMEOUT"
"""Seconds the checkpoint hook's close() waits for pending uploads (default: until done); rank.checkpointer."""
CKPT_PART_MB = "SLURM_TITAN_CKPT_PART_MB"
"""Multipart part size in MiB (at least 5); ckpt.storage.TransferConfig."""
CKPT_CONCURRENCY = "SLURM_TITAN_CKPT_CONCURRENCY"
"""Parallel transfers per process; ckpt.storage.TransferConfig."""
CKPT_BLOCK_KB = "SLURM_TITAN_CKPT_BLOCK_KB"
"""Read/write block size in KiB (a multiple of 4); ckpt.storage.TransferConfig."""
CKPT_DIRECT_IO = "SLURM_TITAN_CKPT_DIRECT_IO"
"""0 turns O_DIRECT writes of a restore off (through the page cache); ckpt.storage.TransferConfig."""
CKPT_FAST_S3 = "SLURM_TITAN_CKPT_FAST_S3"
"""0 uses the generic fsspec (s3fs) S3 path instead of ckpt.storage.s3_http's own HTTP client."""
CKPT_S3_CHECKSUMS = "SLURM_TITAN_CKPT_S3_CHECKSUMS"
"""1 lets botocore compute and send its own request checksums (off by default: ckpt.storage.s3)."""
STORE_RETRY_S = "SLURM_TITAN_STORE_RETRY_S"
"""Seconds one store operation may spend waiting out a store that throttles (503 SlowDown, 429) before it
fails (default 1800); ckpt.storage.backoff.Backoff, in every process that opens a store (the node's
restore too)."""
DATA_CACHE = "SLURM_TITAN_DATA_CACHE"
"""The node-local folder that token shards read from object storage are cached in (default
/var/tmp/slurm-titan-data); rank.token_store."""


def attempt_id(job_id: str, attempt: int) -> str:
    """`<job id>.<attempt>`: the same on every rank of one attempt, different for the next."""
    return f"{job_id}.{attempt}"


def attempt_number(attempt_id: str) -> int:
    """The attempt of an :func:`attempt_id` (0 for an empty one)."""
    return int(attempt_id.rpartition(".")[2] or 0)


@dataclass(frozen=True)
class RankAttemptEnv:
    """What the supervisor tells each rank of the attempt it belongs to."""

    job_dir: Path
    attempt_id: str
    stop_file: Path

    def to_env(self) -> dict[str, str]:
        return {JOB_DIR: str(self.job_dir), ATTEMPT: self.attempt_id, STOP_FILE: str(self.stop_file)}

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> RankAttemptEnv | None:
        """None when the rank was not started by a supervisor (no JOB_DIR)."""
        if not env.get(JOB_DIR):
            return None
        return cls(Path(env[JOB_DIR]), env.get(ATTEMPT, ""), Path(env.get(STOP_FILE, "")))

    @property
    def attempt(self) -> int:
        return attempt_number(self.attempt_id)


@dataclass(frozen=True, kw_only=True)
class RankCheckpointEnv:
    """The checkpoint hook's settings, as the supervisor passes them to every rank (node.spec.CheckpointPlan.rank_env
    makes them; their names are the `checkpoint:` settings')."""

    remote: str
    endpoint_url: str | None = None  # None: the AWS_ENDPOINT_URL(_S3) of the environment
    retention: Retention = KEEP_ALL
    upload_cpus: frozenset[int] | None = None  # None: training's CPUs
    upload_rate: float = 0.0  # 0: unpaced
    config_digest: str = ""

    def to_env(self) -> dict[str, str]:
        retention = self.retention
        env = {CKPT_REMOTE: self.remote, CONFIG_DIGEST: self.config_digest, CKPT_KEEP_LOCAL: str(retention.keep_local),
               CKPT_KEEP_REMOTE: str(retention.keep_remote), CKPT_KEEP_EVERY: str(retention.keep_every)}
        if self.endpoint_url:
            env[CKPT_ENDPOINT_URL] = self.endpoint_url
        if self.upload_cpus:
            env[CKPT_UPLOAD_CPUS] = format_cpu_list(self.upload_cpus)
        if self.upload_rate:
            env[CKPT_UPLOAD_RATE] = f"{self.upload_rate:g}"
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *, default_keep_local: int = 0) -> RankCheckpointEnv | None:
        """None without a remote location (no upload); `default_keep_local` stands for an unset CKPT_KEEP_LOCAL.
        ConfigError (one line) for a malformed value."""
        remote = env.get(CKPT_REMOTE, "").strip()
        if not remote:
            return None
        cpus = env.get(CKPT_UPLOAD_CPUS, "").strip()
        try:
            upload_cpus = parse_cpu_list(cpus) if cpus else None
        except ValueError as error:
            raise ConfigError("environment", CKPT_UPLOAD_CPUS, str(error)) from None
        keep_local = _count(env, CKPT_KEEP_LOCAL)
        retention = Retention(keep_local=default_keep_local if keep_local is None else keep_local,
                              keep_remote=_count(env, CKPT_KEEP_REMOTE) or 0,
                              keep_every=_count(env, CKPT_KEEP_EVERY) or 0)
        rate = env.get(CKPT_UPLOAD_RATE, "").strip() or "0"
        try:
            upload_rate = float(rate)
        except ValueError:
            raise ConfigError("environment", CKPT_UPLOAD_RATE, f"not a number: {rate!r}") from None
        if not upload_rate >= 0:
            raise ConfigError("environment", CKPT_UPLOAD_RATE, f"must be >= 0, got {rate}")
        return cls(remote=remote, endpoint_url=env.get(CKPT_ENDPOINT_URL, "").strip() or None, retention=retention,
                   upload_cpus=upload_cpus, upload_rate=upload_rate, config_digest=env.get(CONFIG_DIGEST, ""))


def _count(env: Mapping[str, str], name: str) -> int | None:
    """A non-negative integer variable; None when unset or blank."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError("environment", name, f"not an integer: {raw!r}") from None
    if value < 0:
        raise ConfigError("environment", name, f"must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class RamEnv:
    """What the supervisor tells each rank of the RAM tier (slurm_titan.ram)."""

    root: Path
    interval: int
    run: str

    def to_env(self) -> dict[str, str]:
        return {RAM_ROOT: str(self.root), RAM_INTERVAL: str(self.interval), RAM_RUN: self.run}

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> RamEnv | None:
        """None without a RAM tier (RAM_ROOT unset). ConfigError (one line) for a malformed interval."""
        root = env.get(RAM_ROOT, "").strip()
        if not root:
            return None
        return cls(Path(root), _count(env, RAM_INTERVAL) or 0, env.get(RAM_RUN, ""))
