"""Uninterrupted runs that several end-to-end tests compare against or read from, trained once per session.

- `reference_losses(steps, *config)` (session fixture): every step's loss of an uninterrupted run of `config`,
  keyed by its arguments and shared by every pytest-xdist worker of the session (a file cache under the
  session's temporary folder; the first worker to ask trains it, the others wait for it);
- `SIXTEEN_STEPS`: the 16-step run with a checkpoint every 4 steps that test_recovery and test_hang fault,
  test_preemption stops and test_runs cancels and resumes in another job (paced: `Cli.submit(paced=True)`);
- `SLOW_NODE_STEPS`: the 60-step run of the config's own batch that test_slow_node slows (the straggler and
  spare-node settings it adds change no loss): a slowed node's steps must cost enough that a swap pays (its
  reference is its own run that goes on on the slow node: test_slow_node);
- `twelve_step_run(nodes)`: the job of an uninterrupted 12-step run on `nodes` nodes with its checkpoints in the
  worker's S3 store (steps 5, 10, 12; 1 MiB checksum blocks), trained once per worker: tests that read it are
  marked `xdist_group("twelve-step-runs")` so that they run where it lives, and a test that changes a checkpoint
  copies it first (`copy_steps`); what a test submitted through its Cli and its copies go when the test ends.

The reference runs' checkpoints go once their losses are read (`Cli.remove_checkpoints`).

A run that failed is neither retried nor reused: every test that asks for it fails with its error.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Cli
from tests.support.configs import DEBUG_CONFIG, SMALL_STEPS
from tests.support.runs import uninterrupted_losses
from tests.support.s3 import S3Server

TWELVE_STEPS = [*SMALL_STEPS, "--set", "checkpoint.interval=5", "--set",
                "torchtitan.args.training.steps=12", "--set", "environment.env.SLURM_TITAN_CKPT_BLOCK_KB=1024"]
TWELVE_STEP_GROUP = pytest.mark.xdist_group("twelve-step-runs")
SIXTEEN_STEPS = [*SMALL_STEPS, "--set", "torchtitan.args.training.steps=16", "--set", "checkpoint.interval=4"]
"""The 16-step run that test_recovery and test_hang fault, test_preemption stops and test_runs interrupts between
jobs (one reference)."""
RAM_INTERVAL = 2
RAM_TIER = ["--set", "checkpoint.memory.enable=true", "--set", f"checkpoint.memory.interval={RAM_INTERVAL}"]
"""The RAM tier on, a snapshot every 2 steps (test_recovery and test_hang add it to SIXTEEN_STEPS: it changes no
loss, so they compare with the same reference)."""
SLOW_NODE_STEPS = [DEBUG_CONFIG, "--set", "torchtitan.args.training.steps=60", "--set", "checkpoint.interval=100"]


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session shares (the session's own one outside xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def cached(folder: Path, key: list[Any], compute: Callable[[], Any]) -> Any:
    """compute()'s value (JSON), computed once for `key` among all processes that share `folder`; a compute that
    raised is recorded, and every later call fails with its error instead of computing again."""
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    entry = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.exists():
            try:
                record = {"key": key, "value": compute()}
            except BaseException as error:
                if not isinstance(error, KeyboardInterrupt):
                    entry.write_text(json.dumps({"key": key, "error": f"{type(error).__name__}: {error}"}))
                raise
            entry.write_text(json.dumps(record))
    record = json.loads(entry.read_text())
    if "error" in record:
        pytest.fail(f"the run {key} failed earlier in this session: {record['error']}", pytrace=False)
    return record["value"]


@pytest.fixture(scope="session")
def reference_losses(slurm_env: dict, s3_server: S3Server,
                     tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[int, str]]:
    """losses(steps, *config): {step: loss} of an uninterrupted run of `config`, trained once per session."""
    folder = session_folder(tmp_path_factory) / "reference-losses"

    def losses(steps: int, *config: str) -> dict[int, str]:
        def train() -> list[tuple[int, str]]:
            with Cli(slurm_env, tmp_path_factory.mktemp("reference"), s3_server) as cli:  # its losses are all we keep
                return sorted(uninterrupted_losses(cli, steps, *config).items())

        return {step: loss for step, loss in cached(folder, [steps, *config], train)}

    return losses


@pytest.fixture(scope="session")
def twelve_step_runs() -> dict[int, tuple[Cli, str] | BaseException]:
    """The uninterrupted 12-step runs trained so far this session, by node count (`twelve_step_run` trains them)."""
    return {}


@pytest.fixture
def twelve_step_run(twelve_step_runs: dict[int, tuple[Cli, str] | BaseException], slurm_env: dict,
                    s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory,
                    ) -> Iterator[Callable[[int], tuple[Cli, str]]]:
    """run(nodes): (the Cli that submitted it, its job id) of the uninterrupted 12-step run on `nodes` nodes, trained
    once per worker; what the test submitted through that Cli, and its copies of the run, are deleted after it."""
    runs = twelve_step_runs

    def run(nodes: int) -> tuple[Cli, str]:
        if nodes not in runs:
            cli = Cli(slurm_env, tmp_path_factory.mktemp(f"twelve-steps-{nodes}"), s3_server)
            try:
                job = cli.submit(*TWELVE_STEPS, "--set", f"slurm.nodes={nodes}")
                status = cli.wait(job)
                assert status["state"] == "COMPLETED", status
                cli.kept.add(job)
                runs[nodes] = cli, job
            except Exception as error:
                runs[nodes] = error
                raise
        done = runs[nodes]
        if isinstance(done, BaseException):
            pytest.fail(f"the 12-step run on {nodes} nodes failed earlier in this session: {done}", pytrace=False)
        return done

    yield run
    for done in runs.values():
        if isinstance(done, tuple):
            done[0].remove_checkpoints()


def remote_of(cli: Cli, job: str) -> str:
    """The checkpoint location of a debug-cpu job that `cli` submitted."""
    return cli.remote.format(name="debug-cpu", job_id=job)


def copy_steps(s3_server: S3Server, src: str, dst: str, steps: list[int]) -> None:
    """A run location holding only some committed checkpoints of another (catalog entries included): what a
    test changes or resumes from, leaving the shared run as it was."""
    import s3fs  # here: the plugin loads in every session, unit tests' too

    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    for path in fs.find(src[5:]):
        rel = path[len(src[5:]) + 1:]
        step = re.match(r"(?:\.slurm-titan/catalog/)?step-(\d+)", rel)
        if step and int(step.group(1)) in steps:
            fs.copy(path, f"{dst[5:]}/{rel}")
