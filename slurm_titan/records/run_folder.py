"""The map of a job's folder on the shared filesystem: every path the login node, the batch shell, the
node supervisors and the ranks build in it (as ckpt.layout is for a checkpoint location).

    <runs_dir>/<name>/<job id>/              job_folder; the plan names it before the id is known: {job_id}
      <job id>_submission.sh                 submitit: the sbatch script (node.batch.finish reruns its srun line)
      <job id>_submitted.pkl                 submitit: the pickled node supervisor
      <job id>_<task>_log.out                submitit: one node log per node (task)
      <job id>_<task>_result.pkl             submitit: each node supervisor's return
      batch-spec.json                        node.batch_spec: what the batch shell's processes read (the sbatch
                                             script writes it first)
      history.jsonl                          records.history: the run's start/end/step events, node 0 appends
      watchdog.json                          node.budgets: the slowest step learned, for the next attempt
      excluded-nodes.json                    node.batch.allocation: nodes this run left out, with why
      logs/rank-<R>.log                      node.supervisor: each rank's output, over every attempt
      dump/                                  torchtitan's dump_folder (traces, structured logs, flight recorder)
        checkpoint/                          torchtitan's checkpoint folder when checkpoint.local is unset
      doctor/attempt-<A>/                    doctor.exchange: the preflight's reports (node-<N>.json,
                                             reach-<N>.json) and node 0's verdict.json
      attempts/<A>/                          node.batch.allocation: one per attempt, numbered across restarts, requeues
        node-<N>.json                        node.supervisor: node N's report (exit codes, first failure, hang)
        stop-node-<N>                        node.supervisor: the stop signal node N got, for ranks not yet listening
        batch-shell-alive                    node.batch.step_watch: touched every second while the batch shell lives
                                             (node.supervisor.batch_host: the other nodes' supervisors read its mtime)
        batch-host-probe[-<K>]               node.supervisor.batch_host: made exclusively by the one supervisor that
                                             checks a batch host without heartbeat, which writes its outcome in it
                                             (-<K>: the K-th take-over, after a claimant that died)
        lost-nodes.json                      node.batch.step_watch: the nodes its probe found lost, before it ended
                                             the step (node.batch.finish blames them without probing again)
        trained-step                         rank.progress: the last step the attempt trained (rank 0 replaces it;
                                             node.batch.step_watch starts a standby step when it first appears)
        restore/                             node.supervisor.restore: the nodes' agreement on each checkpoint candidate
                                             (ckpt.agree: step-<S>/node-<N>.ok, or .json with a rejection)
        stacks/node-<N>.txt                  node.supervisor.stacks: node N's ranks' Python stacks, dumped on a hang
                                             (stacks/rank-<R>.txt, a file a rank, in runs before 2026-12-06)
        timing/node-<N>.json                 node.supervisor.timing: node N's ranks' steps, working and wall time
                                             (records.node_timing), replaced every few seconds
        node-scores.jsonl                    node.batch.straggler: every node's score against the others over
                                             time (records.slow_nodes), appended by the batch shell
        slow-node.json                       node.batch.straggler: the node named slow in the attempt, and the
                                             action taken (records.slow_nodes)

Only names live here; what a file holds belongs to the module that writes it. The names are on disk in
old runs and read by tests: they never change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from slurm_titan.records.held_folder import HeldFolder

JOB_ID = "{job_id}"
"""Where a planned path or value takes the job's id (filled in on the node: :func:`fill`)."""
JOB_DIR = "{job_dir}"
"""Where a planned value takes the job's folder (filled in on the node: :func:`fill`)."""
SLURM_JOB_ID = "%j"
"""Slurm's and submitit's own placeholder for the job id (in names submitit makes)."""
NAME = "{name}"
"""Where a configured path or URL takes the job's name (filled in when the job is planned: :func:`planned`)."""
RUN = "{run}"
"""Where a configured checkpoint location takes the run's name (launch.run_binding; a run's location has its name
in place of :data:`JOB_ID` too)."""


def planned(text: str, name: str) -> str:
    """A configured path or URL as the plan holds it: the job's name in place of :data:`NAME`, and Slurm's
    :data:`SLURM_JOB_ID` written as :data:`JOB_ID` (filled in on the node)."""
    return text.replace(NAME, name).replace(SLURM_JOB_ID, JOB_ID)


def fill(text: str, job_id: str, job_dir: str | None = None) -> str:
    """`text` with the job's folder (when given) and id in place of :data:`JOB_DIR` and :data:`JOB_ID`."""
    return (text if job_dir is None else text.replace(JOB_DIR, job_dir)).replace(JOB_ID, job_id)


def before_job_id(text: str) -> str:
    """What every job of a planned `text` shares: the part before :data:`JOB_ID` (all of it without one)."""
    return text.split(JOB_ID)[0]


def job_folder(runs_dir: Path, name: str, job_id: str = JOB_ID) -> Path:
    return runs_dir / name / job_id


# ---- submitit's files -----------------------------------------------------------------------------------
def submission_script(job_dir: Path, job_id: str) -> Path:
    return job_dir / f"{job_id}_submission.sh"


def node_logs(job_dir: Path, job_id: str) -> list[Path]:
    """submitit's node logs of the job, by task (node)."""
    return sorted(job_dir.glob(f"{job_id}_*_log.out"), key=lambda path: int(path.name.split("_")[1]))


# ---- the run's own records ------------------------------------------------------------------------------
def batch_spec_file(job_dir: Path) -> Path:
    return job_dir / "batch-spec.json"


def history_file(job_dir: Path) -> Path:
    return job_dir / "history.jsonl"


def calibration_file(job_dir: Path) -> Path:
    return job_dir / "watchdog.json"


def excluded_nodes_file(job_dir: Path) -> Path:
    return job_dir / "excluded-nodes.json"


def rank_logs_folder(job_dir: Path) -> Path:
    return job_dir / "logs"


def rank_log(job_dir: Path, rank: int) -> Path:
    return rank_logs_folder(job_dir) / f"rank-{rank}.log"


def dump_folder(job_dir: Path) -> Path:
    return job_dir / "dump"


def default_checkpoint_folder(job_dir: Path) -> Path:
    return dump_folder(job_dir) / "checkpoint"


def doctor_folder(job_dir: Path, attempt: int) -> Path:
    return job_dir / "doctor" / f"attempt-{attempt}"


# ---- one attempt ----------------------------------------------------------------------------------------
def attempts_folder(job_dir: Path) -> Path:
    return job_dir / "attempts"


def attempt_folder(job_dir: Path, attempt: int) -> Path:
    return attempts_folder(job_dir) / str(attempt)


def attempt_numbers(job_dir: Path) -> list[int]:
    """The attempts whose folder exists, in order."""
    root = attempts_folder(job_dir)
    return sorted(int(entry.name) for entry in root.iterdir() if entry.name.isdigit()) if root.is_dir() else []


def node_report(job_dir: Path, attempt: int, node: int) -> Path:
    return attempt_folder(job_dir, attempt) / node_report_name(node)


def node_report_name(node: int) -> str:
    """The name of node `node`'s report in its attempt's folder."""
    return f"node-{node}.json"


def reported_exit_code(attempt_dir: HeldFolder, node: int) -> int | None:
    """The exit code in node `node`'s report (node.supervisor writes it), None while it has none that reads."""
    try:
        code = json.loads(attempt_dir.read_text(node_report_name(node)))["exit_code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, int) else None


def node_files(folder: Path, suffix: str = ".json") -> set[int]:
    """The N of the `node-N<suffix>` files in `folder` (node reports, by default): one listing, however many nodes
    (a lookup per node and per poll, on a shared file system, grows with the square of the node count)."""
    try:
        return node_numbers(os.listdir(folder), suffix)
    except OSError:
        return set()


def node_numbers(names: list[str], suffix: str) -> set[int]:
    """The N of the names `node-N<suffix>` among `names`."""
    return {int(name[5:-len(suffix)]) for name in names if name.startswith("node-") and name.endswith(suffix)
            and name[5:-len(suffix)].isdigit()}


def stop_file(job_dir: Path, attempt: int, node: int) -> Path:
    return attempt_folder(job_dir, attempt) / f"stop-node-{node}"


BATCH_SHELL_BEAT = "batch-shell-alive"
"""The batch shell's heartbeat, in its attempt's folder."""


def batch_shell_beat(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / BATCH_SHELL_BEAT


def batch_host_probe_name(claim: int = 0) -> str:
    """The name of the claim of the batch host's check in its attempt's folder (`claim`: the take-overs before it)."""
    return "batch-host-probe" + (f"-{claim}" if claim else "")


REPORT_SIGHTINGS = "report-sightings.json"
"""When the batch shell's step watcher first saw each node's report, on its clock (node.batch.step_watch)."""


def report_sightings(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / REPORT_SIGHTINGS


AHEAD = "next-started-ahead.json"
"""The srun step the batch shell started ahead for the attempt after this one (its attempt, pid and nodes), in this
attempt's folder (node.batch.ahead)."""
AHEAD_EXIT = "next-started-ahead-exit"
"""That step's srun exit code, written when it ended, beside it."""
AHEAD_WORD = "started-ahead-word.json"
"""The batch shell's word to a step started ahead, in its own attempt's folder: train as this attempt, or end."""
AHEAD_CLOSED = "next-decided"
"""Written in an attempt's folder as the batch shell decides what follows it: no step is started ahead after it."""


def lost_nodes(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / "lost-nodes.json"


TRAINED_STEP = "trained-step"
"""In an attempt's folder: the last step it trained (records.history.write_trained_step)."""


def trained_step_file(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / TRAINED_STEP


def ram_folder(job_dir: Path, attempt: int) -> Path:
    """What each node of the attempt holds in memory and where its snapshot server listens (node-K.json)."""
    return attempt_folder(job_dir, attempt) / "ram"


RESTORE_VERDICTS = "restore"
"""The nodes' verdicts on restore candidates, in their attempt's folder (slurm_titan.ckpt.NodeAgreement)."""


def restore_verdicts(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / RESTORE_VERDICTS


STACKS = "stacks"
"""The folder of an attempt's folder that holds the stacks its nodes' watchdogs took."""


def stacks_folder(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / STACKS


def node_stacks_name(node: int) -> str:
    """The name of node `node`'s stacks file (every rank of the node, each under `==> rank R <==`)."""
    return f"node-{node}.txt"


def stack_files(job_dir: Path, attempt: int) -> list[Path]:
    """The stack files of an attempt, by node (by rank in runs that wrote a file a rank)."""
    folder = stacks_folder(job_dir, attempt)
    return [folder / node_stacks_name(node) for node in sorted(node_files(folder, ".txt"))] or sorted(
        folder.glob("rank-*.txt"), key=lambda p: int(p.stem.partition("-")[2] or 0))


def timing_folder(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / "timing"


def node_timing(job_dir: Path, attempt: int, node: int) -> Path:
    return timing_folder(job_dir, attempt) / f"node-{node}.json"


def node_scores(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / "node-scores.jsonl"


def slow_node(job_dir: Path, attempt: int) -> Path:
    return attempt_folder(job_dir, attempt) / "slow-node.json"
