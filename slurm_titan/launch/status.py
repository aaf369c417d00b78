"""`slurm-titan status`: Slurm's state of a job joined with the run's own attempt history; of a run (`status RUN`),
every job and attempt of it in order, with the run's goodput over all its jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slurm_titan import slurm
from slurm_titan.errors import SlurmTitanError
from slurm_titan.launch import goodput, run_view
from slurm_titan.records import history, jobs, run_folder, run_registry


def _state_from_history(attempts: list[history.Attempt]) -> str:
    if not attempts or attempts[-1].ended is None:
        return "UNKNOWN"
    return "COMPLETED" if attempts[-1].exit_code == 0 else "FAILED"


def describe(job_id: str, states: dict[str, slurm.JobState] | None = None) -> dict[str, Any]:
    """Everything known of one job: Slurm's state (or the run record's when Slurm forgot it) and its attempts.
    `states`: Slurm's answer for several jobs at once (:func:`slurm.job_states`), when the caller has it."""
    try:
        record: jobs.JobRecord | None = jobs.load(job_id)
    except SlurmTitanError:
        record = None
    attempts = history.read_attempts(record.folder) if record else []
    state = slurm.job_state(job_id) if states is None else states.get(job_id)
    if state is None and record is None:
        raise SlurmTitanError(f"job {job_id} is unknown to Slurm and to slurm-titan")
    return {
        "job_id": job_id,
        "name": record.name if record else None,
        "job_dir": record.job_dir if record else None,
        "state": state.state if state else _state_from_history(attempts),
        "source": state.source if state else "run record",
        "reason": state.reason if state else None,
        "nodes": state.nodes if state else None,
        "restarts": state.restarts if state else max(len(attempts) - 1, 0),
        "exit_code": state.exit_code if state else None,
        "attempts": history.as_dicts(attempts),
    } | _goodput(record, attempts)


def describe_all(job_ids: list[str]) -> list[dict[str, Any]]:
    """:func:`describe` of each job, Slurm asked once for all of them."""
    states = slurm.job_states(job_ids)
    return [describe(job_id, states) for job_id in job_ids]


def _goodput(record: jobs.JobRecord | None, attempts: list[history.Attempt]) -> dict[str, Any]:
    """The run's goodput and each attempt's time (slurm_titan.launch.goodput), given the submit time."""
    if record is None:
        return {"goodput": None, "attempt_times": []}
    result = goodput.compute(attempts, record.submitted, time.time(), goodput.trained_files(record.folder, attempts))
    return {"goodput": result.as_dict(), "attempt_times": [a.as_dict() for a in result.attempts]}


def goodput_text(numbers: dict[str, Any] | None) -> str:
    return "-" if not numbers or numbers["goodput"] is None else f"{numbers['goodput'] * 100:.1f}%"


def _time_text(times: dict[str, Any]) -> str:
    steps = f" ({times['retrained_steps']} steps)" if times["retrained_steps"] else ""
    return (f"    time: lost {times['lost_s']:.0f}s = queue {times['queue_s']:.0f}s"
            f" + start-up {times['startup_s']:.0f}s"
            f" + retrained {times['retrained_s']:.0f}s{steps} + stopping {times['stopping_s']:.0f}s;"
            f" training {times['training_s']:.0f}s, {times['new_steps']} new steps")


def _clock(stamp: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp else "-"


def _attempt_lines(attempt: dict[str, Any], times: dict[str, Any] | None, info: dict[str, Any],
                   label: str = "") -> None:
    last = attempt["stopped_at_step"] or attempt["last_step"] or attempt["trained_step"]
    steps = f" steps {attempt['first_step'] or '-'}..{last or '-'}"
    lost = f" lost {attempt['time_lost_s']}s" if "time_lost_s" in attempt else ""
    stop = f" on {attempt['stop_signal']}" if attempt["stop_signal"] else ""
    cause = f", {attempt['cause']}" if attempt["cause"] else ""
    then = f" -> {attempt['action']}" if attempt["action"] in ("restart", "requeue") else ""
    retrained = f" retrained {attempt['steps_retrained']}" if attempt.get("steps_retrained") else ""
    excluded = f" excluded {','.join(attempt['excluded'])}" if attempt["excluded"] else ""
    note = f" ({attempt['note']})" if attempt["reason"] == "restart loop" and attempt.get("note") else ""
    print(f"  {label}attempt {attempt['attempt']}: {','.join(attempt['hosts'])} {_clock(attempt['started'])}"
          f" -> {_clock(attempt['ended'])} exit={attempt['exit_code']} {attempt['reason'] or 'running'}"
          f"{cause}{note}{stop}{then}{steps}{retrained}{lost}{excluded}")
    for slow in attempt["slow"]:
        print(f"    slow node {slow['host']}: score {slow['score']:.2f} over steps {slow['since_step']}.."
              f"{slow['step']} -> {slow['action']} ({slow['why']})")
    if times is not None:
        print(_time_text(times))
    if (attempt["cause"] or "").startswith("hung on ") and info["job_dir"]:
        print(f"    stacks: slurm-titan logs {info['job_id']} --stacks "
              f"({run_folder.stacks_folder(Path(info['job_dir']), attempt['attempt'])})")


def _print(info: dict[str, Any]) -> None:
    print(f"job {info['job_id']} {info['name'] or ''}: {info['state']} (from {info['source']})"
          f"  nodes={info['nodes'] or '-'} restarts={info['restarts']}"
          + (f" reason={info['reason']}" if info["reason"] and info["reason"] != "None" else "")
          + (f" goodput={goodput_text(info['goodput'])}" if info.get("goodput") else ""))
    times = {t["attempt"]: t for t in info.get("attempt_times", [])}
    for attempt in info["attempts"]:
        _attempt_lines(attempt, times.get(attempt["attempt"]), info)


def describe_run(record: run_registry.RunRecord) -> dict[str, Any]:
    """A run across its jobs: each job as :func:`describe` has it, and the run's attempts in order on one step axis
    and one wall clock, with the run's goodput (launch.run_view: the gaps between jobs counted lost)."""
    whole = run_view.view(record, time.time())
    infos = describe_all([job.job_id for job in whole.jobs])
    return {"run": record.name, "remote": record.remote, "jobs": infos, "goodput": whole.goodput.as_dict(),
            "attempt_times": [{"job_id": job_id, "job_attempt": attempt.attempt} | times.as_dict()
                              for (job_id, attempt), times in zip(whole.attempts, whole.goodput.attempts,
                                                                  strict=True)]}


def _print_run(run: dict[str, Any]) -> None:
    jobs_text = ", ".join(f"{info['job_id']} {info['state']}" for info in run["jobs"]) or "none recorded here"
    print(f"run {run['run']}: jobs {jobs_text}; goodput={goodput_text(run['goodput'])} over "
          f"{run['goodput']['wall_s']:.0f}s, the gaps between jobs counted lost ({run['remote']})")
    times = {(t["job_id"], t["job_attempt"]): t for t in run["attempt_times"]}
    for info in run["jobs"]:
        for attempt in info["attempts"]:
            _attempt_lines(attempt, times.get((info["job_id"], attempt["attempt"])), info, f"job {info['job_id']} ")


def show(job_id: str | None, as_json: bool = False) -> int:
    """`status [JOB|RUN]`: a job, a run across its jobs, or the recent jobs."""
    run = run_registry.load(job_id) if job_id and not run_registry.name_problem(job_id) else None
    if run is not None:
        described = describe_run(run)
        if as_json:
            print(json.dumps(described, indent=1))
        else:
            _print_run(described)
        return 0
    infos = [describe(job_id)] if job_id else describe_all([r.job_id for r in jobs.recent()])
    if as_json:
        print(json.dumps(infos[0] if job_id else infos, indent=1))
    else:
        for info in infos:
            _print(info)
        if not infos:
            print("no jobs submitted from here yet")
    return 0
