"""Which run a job belongs to, and so where its checkpoints go: `submit --run NAME`, `--resume JOB|RUN|LOCATION`,
`--fresh`, `--take-over` (and `run:` in the config).

    --run NAME          the run NAME: its first job starts at step 1, every later one resumes from the newest complete
                        checkpoint of the run's location, whatever ended the job before (Composer's `autoresume` with
                        its `run_name`, W&B's `resume="allow"`)
    --resume X          continue X, which must exist: a run, a job (one submitted before runs had names too: its
                        location is read from its job folder), or a checkpoint location (W&B's `resume="must"`)
    --fresh             start at step 1; refused where the location holds a complete checkpoint (`resume="never"`)

A run's location is made from the config when its first job is submitted (`checkpoint.remote` with the run's name
in place of `{job_id}` and of `{run}`) and recorded (records.run_registry): later jobs write there whatever the config
says by then. :func:`bind` works the binding out of the registry alone (a dry run's too); :func:`check` asks the
store and Slurm before anything is submitted; :func:`record` keeps the run and the job once sbatch took it.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

from slurm_titan import slurm
from slurm_titan.errors import ConfigError, RunError
from slurm_titan.launch.config import JobConfig
from slurm_titan.launch.config_digest import check_change
from slurm_titan.records import jobs, run_registry
from slurm_titan.records.run_folder import JOB_ID, RUN, planned


@dataclass(frozen=True)
class RunBinding:
    """A job's run (`name` None: a job of its own, as before runs had names) and its checkpoint location."""

    name: str | None = None
    remote: str | None = None
    endpoint_url: str | None = None
    known: run_registry.RunRecord | None = None  # the run's record when the run is recorded here already
    resume: bool = False  # --resume: the location should hold a checkpoint
    fresh: bool = False  # --fresh: the location must hold none

    @property
    def fixed(self) -> bool:
        """The location is the same for every job (not made per job from `{job_id}`)."""
        return self.remote is not None and JOB_ID not in self.remote


def location(remote: str, job_name: str, run: str) -> str:
    """`checkpoint.remote` of job `job_name` made the location of run `run`."""
    return planned(remote, job_name).replace(RUN, run).replace(JOB_ID, run)


def bind(config: JobConfig, *, run: str | None = None, resume: str | None = None,
         fresh: bool = False) -> tuple[JobConfig, RunBinding]:
    """The config to plan (its `checkpoint.remote` the run's location) and the binding; ConfigError or RunError
    (one line, exit 2) for a bad run name, an unknown run or job to resume, or a run without a remote location."""
    if run is not None and (problem := run_registry.name_problem(run)):
        raise ConfigError("--run", None, problem)
    if fresh and resume is not None:
        raise ConfigError("--fresh", None, "starts at step 1; --resume continues: give one of them")
    run = run or config.run
    ckpt = config.checkpoint
    if RUN in (ckpt.remote or "") + (ckpt.local or "") and run is None and resume is None:
        raise ConfigError(config.source, "checkpoint", "{run} in a location needs a run: --run NAME or run: NAME")
    if run is None and resume is None:
        remote = planned(ckpt.remote, config.name) if ckpt.enable and ckpt.remote else None
        return config, RunBinding(remote=remote, endpoint_url=ckpt.endpoint_url, fresh=fresh)
    if not (ckpt.enable and ckpt.remote):
        raise ConfigError(config.source, "checkpoint.remote", "a run keeps its checkpoints in a remote location: "
                                                              "set checkpoint.enable: true and checkpoint.remote")
    binding = _resumed(resume, run, config) if resume is not None else _named(run or "", config, fresh)
    if binding.known is not None and binding.remote != location(ckpt.remote, config.name, binding.known.name):
        print(f"slurm-titan: run {binding.name} stays at {binding.remote} (where its first job put it), whatever "
              "checkpoint.remote says now", file=sys.stderr)
    local = ckpt.local.replace(RUN, binding.name or "") if ckpt.local else None
    checkpoint = dataclasses.replace(ckpt, remote=binding.remote, local=local, endpoint_url=binding.endpoint_url)
    return dataclasses.replace(config, run=binding.name, checkpoint=checkpoint), binding


def _named(run: str, config: JobConfig, fresh: bool) -> RunBinding:
    known = run_registry.load(run)
    if known is not None:
        return RunBinding(run, known.remote, known.endpoint_url or config.checkpoint.endpoint_url, known, fresh=fresh)
    remote = location(config.checkpoint.remote or "", config.name, run)
    return RunBinding(run, remote, config.checkpoint.endpoint_url, fresh=fresh)


def _resumed(resume: str, run: str | None, config: JobConfig) -> RunBinding:
    """The run `resume` names: a recorded run, the run (or location) of a recorded job, or a location."""
    endpoint = config.checkpoint.endpoint_url
    known = run_registry.load(resume) if not run_registry.name_problem(resume) else None
    if known is None and (job := jobs.find(resume)) is not None:
        if job.run is not None:
            known = run_registry.load(job.run)
        if known is None:
            return _adopted(run or job.run or f"{job.name}-{job.job_id}", _job_location(job), endpoint)
    if known is not None:
        if run is not None and run != known.name:
            raise ConfigError("--run", None, f"{run!r}: --resume {resume} continues run {known.name}")
        return RunBinding(known.name, known.remote, known.endpoint_url or endpoint, known, resume=True)
    if "://" in resume or resume.startswith("/"):
        if run is None:
            raise ConfigError("--resume", None, f"{resume}: name the run that continues this location: --run NAME")
        return _adopted(run, resume.rstrip("/"), endpoint)
    listed = ", ".join(run_registry.names()[-5:]) or "none"
    raise RunError(f"--resume {resume}: no run or job {resume} was submitted from here (runs: {listed}; see "
                   f"slurm-titan runs); to continue a checkpoint location, give it: --resume s3://... --run NAME")


def _adopted(run: str, remote: str, endpoint_url: str | None) -> RunBinding:
    """Run `run` continuing `remote` (a location of a job or one given): recorded already only if it is the same."""
    if problem := run_registry.name_problem(run):
        raise ConfigError("--run", None, problem)
    known = run_registry.load(run)
    if known is not None and known.remote != remote:
        raise RunError(f"run {run} writes to {known.remote}, not {remote}: give the new run another name (--run)")
    return RunBinding(run, remote, endpoint_url, known, resume=True)


def _job_location(job: jobs.JobRecord) -> str:
    """A recorded job's checkpoint location: in its record, or (a job from before runs had names) in the node
    supervisor's spec that submitit pickled into its job folder."""
    if job.remote:
        return job.remote
    from submitit.core.utils import DelayedSubmission

    pickled = job.folder / f"{job.job_id}_submitted.pkl"
    try:
        supervisor: Any = DelayedSubmission.load(pickled).function
        checkpoint = supervisor.spec.checkpoint
    except (OSError, AttributeError, EOFError, ImportError, ValueError) as error:
        raise RunError(f"--resume {job.job_id}: {pickled}: cannot read the job's checkpoint location ({error}); "
                       "give the location instead: --resume s3://... --run NAME") from None
    remote = checkpoint.remote_for(job.job_id) if checkpoint else None
    if not remote:
        raise RunError(f"--resume {job.job_id}: the job kept no remote checkpoints (no checkpoint.remote)")
    return remote


def check(binding: RunBinding, config: JobConfig, *, take_over: bool = False) -> str | None:
    """Whether the job may write to its location, asked of Slurm and the store before anything is submitted; what
    it will resume (a line), None for a job of its own. RunError (one line, exit 2) when another job of the run is
    active in Slurm, when the location's writer lease is held (ckpt.lease) or corrupt, when a fresh start or a new
    run finds checkpoints there; ConfigError when `config` cannot load the newest checkpoint (launch.config_digest);
    ClusterError / StorageError when Slurm or the store cannot be asked."""
    if not binding.fixed or binding.remote is None:
        return None
    from slurm_titan.ckpt import lease_verdict as verdict
    from slurm_titan.ckpt import list_checkpoints, newest_complete, open_store, read_lease, read_manifest

    if binding.known is not None:
        active = [s for s in slurm.job_states(binding.known.jobs).values() if s.state not in slurm.FINISHED_STATES]
        if active:
            job = active[-1]
            raise RunError(f"run {binding.name}: job {job.job_id} is {job.state} in Slurm and writes to "
                           f"{binding.remote}; wait for it to end or cancel it (slurm-titan cancel {job.job_id})")
    store = open_store(binding.remote, endpoint_url=binding.endpoint_url, check=True, create=True)
    newest = newest_complete(list_checkpoints(store))
    if newest is not None and (binding.fresh or (binding.name and binding.known is None and not binding.resume)):
        what = "--fresh starts at step 1" if binding.fresh else f"run {binding.name} is new here"
        raise RunError(f"{binding.remote} holds checkpoints (newest complete: step {newest.step}) and {what}: "
                       f"continue them with --resume {binding.remote} --run NAME, or choose another run name")
    if newest is not None:
        saved = read_manifest(store, newest.step).config_digest
        check_change(config, saved, f"checkpoint step {newest.step} of {binding.remote}")

    lease = verdict(store, read_lease(store), slurm.state_name, take_over=take_over)
    taken = "" if lease == "free" else f" (writer lease: {lease})"
    start = f"resumes from step {newest.step}" if newest else "starts at step 1 (no complete checkpoint there)"
    return f"{'run ' + binding.name if binding.name else 'the job'} {start} of {binding.remote}{taken}"


def record(binding: RunBinding, job_id: str) -> None:
    """Keep the run with its new job (a new run: recorded with its location)."""
    if binding.name is None or binding.remote is None:
        return
    if binding.known is None:
        run_registry.create(binding.name, binding.remote, binding.endpoint_url, job_id)
    else:
        run_registry.add_job(run_registry.load(binding.name) or binding.known, job_id)
