"""Hangs on the real local Slurm cluster: a rank stopped (SIGSTOP, from outside) mid-step, one stopped during
a checkpoint save, one blocked in its data loader on a dataset file that stops delivering (a FIFO).

Each must be found by the node supervisor's watchdog (not by a torch collective timeout), leave the stacks of
the node's ranks with the stopped rank's among them, be blamed on the stopped rank and its node, and recover:
the job COMPLETED with every loss equal to an uninterrupted run's. The mid-step one runs with the RAM tier on and
resumes from the nodes' own memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_titan.envvars import PROGRESS_FILE
from slurm_titan.records import rank_progress, run_folder
from slurm_titan.records.rank_progress import Phase
from tests.support.cli import Cli, wait_for
from tests.support.paths import REPO
from tests.support.references import RAM_INTERVAL, RAM_TIER, SIXTEEN_STEPS
from tests.support.runs import assert_same_training, node_log_text, uninterrupted_losses
from tools.local_cluster.cluster import LocalCluster
from tools.local_cluster.faults import SignalAtStep, step_reached

pytestmark = [pytest.mark.cluster, pytest.mark.train]
STEPS = 16
CONFIG = SIXTEEN_STEPS
COLLECTIVE_TIMEOUT_S = 1200  # timeouts.collective_s of the default config


@pytest.fixture
def reference(reference_losses) -> dict[int, str]:
    """The uninterrupted run of CONFIG (test_recovery and test_hang share it: tests.support.references)."""
    return reference_losses(STEPS, *CONFIG)


def rank_stack(folder: Path, attempt: int, rank: int) -> str:
    """Rank `rank`'s stacks as its node's watchdog took them ('' when none did)."""
    text = "".join(path.read_text() for path in run_folder.stack_files(folder, attempt))
    return text.partition(f"==> rank {rank} <==\n")[2].partition("==> rank ")[0]


def hang_report(folder: Path, attempt: int) -> dict:
    """The hang record of the node that blamed itself (the culprit's), from the attempt's node reports."""
    reports = [json.loads(p.read_text()) for p in sorted((folder / "attempts" / str(attempt)).glob("node-*.json"))]
    hangs = [report["hang"] for report in reports if report.get("hang")]
    assert hangs, reports
    return min(hangs, key=lambda h: (not h["frozen"], bool(h["in_collective"]), h["since"]))


def assert_found_by_the_watchdog(cli: Cli, job: str, status: dict, stopped: dict[str, str], phase: str) -> dict:
    folder = cli.job_dir(job)
    first = status["attempts"][0]
    assert (first["reason"], first["action"]) == ("failed", "restart"), first
    assert re.fullmatch(rf"hung on {stopped['SLURMD_NODENAME']} rank 1 at step \d+ \({phase}\)", first["cause"]), first
    hang = hang_report(folder, 0)
    assert hang["rank"] == 1 and hang["time"] - hang["since"] < COLLECTIVE_TIMEOUT_S
    logs = "".join(p.read_text(errors="replace") for p in (folder / "logs").glob("rank-*.log"))
    assert not re.search(r"Timed out|collective operation timeout", logs), "a collective timed out first"
    assert rank_stack(folder, 0, 1).strip(), "no stack of the stopped rank"
    assert "--stacks" in cli("status", job).stdout
    assert "==> rank 1 <==" in cli("logs", job, "--stacks").stdout
    return hang


def test_a_rank_stopped_mid_step_is_found_and_the_run_recovers_from_memory(cli: Cli,
                                                                           reference: dict[int, str]) -> None:
    # The RAM tier on (issue 25): the hang's attempt resumes on the same nodes from their own memory
    job = cli.submit(*CONFIG, *RAM_TIER, paced=True)
    folder = cli.job_dir(job)
    with SignalAtStep(folder, job, {"RANK": "1"}, step_reached(6), signal.SIGSTOP, times=1, poll_s=0.005) as fault:
        status = cli.wait(job, timeout=900)
    assert fault.signalled
    assert status["state"] == "COMPLETED", status
    hang = assert_found_by_the_watchdog(cli, job, status, fault.signalled[0], "step")
    assert hang["frozen"] and hang["step"] in (6, 7)
    first, second = status["attempts"][:2]
    # from step 4's snapshot (step 6's, were the stop to land after its background write was sealed)
    assert second["first_step"] in (5, 7) and first["steps_retrained"] <= RAM_INTERVAL, (first, second)
    assert (f"resuming RAM snapshot step {second['first_step'] - 1}: every rank's copy from this node's memory"
            in node_log_text(cli, job))
    assert_same_training(cli, job, reference)


def _saving(cluster: LocalCluster) -> Callable[[dict[str, str], str], bool]:
    """The rank is inside a checkpoint save (its progress record, in its node's own /dev/shm, says so), at step 8 or
    later."""
    def ready(env: dict[str, str], log: str) -> bool:
        path = cluster.node_path(env["SLURMD_NODENAME"], env.get(PROGRESS_FILE, "/nonexistent"))
        record = rank_progress.read(path) if path else None
        return record is not None and record.phase == Phase.SAVE and record.step >= 8

    return ready


def test_a_rank_stopped_during_a_checkpoint_save_never_commits_it(cli: Cli, cluster: LocalCluster,
                                                                   reference: dict[int, str]) -> None:
    job = cli.submit(*CONFIG, paced=True)  # the stopped budget (3 s) holds in a save as in a step
    folder = cli.job_dir(job)
    with SignalAtStep(folder, job, {"RANK": "1"}, _saving(cluster), signal.SIGSTOP, times=1, poll_s=0.005) as fault:
        status = cli.wait(job, timeout=900)
    assert fault.signalled
    assert status["state"] == "COMPLETED", status
    hang = assert_found_by_the_watchdog(cli, job, status, fault.signalled[0], "checkpoint save")
    first, second = status["attempts"][:2]
    # the save that hung was never committed: the next attempt resumed from the checkpoint before it
    assert second["first_step"] == hang["step"] - 4 + 1, (hang, second)
    assert_same_training(cli, job, reference)


# ---- the data loader ------------------------------------------------------------------------------------
# The debug dataset is read whole at start-up (datasets.load_dataset, not streamed). To stall a rank in its
# data loader mid-training, this test streams a dataset of two shards, one per rank (split_dataset_by_node
# gives rank r shard r when the shard count divides the world size), through tests/support/streamed_dataset.py (an
# override the ranks import). Rank 1's shard is a FIFO fed by the test: the first time it stops feeding after
# FEED_LINES lines and holds the pipe open (the rank blocks in read()); every later opening gets it whole.

FEED_LINES = 8  # ~800 tokens: about 6 steps of 128 tokens (tests.support.configs)


def _shards(folder: Path) -> list[str]:
    from slurm_titan.launch.debug_assets import _documents

    lines = [json.dumps({"text": text}) + "\n" for text in _documents(0, 4000)]
    return ["".join(lines[0::2]), "".join(lines[1::2])]


def _dataset_config(folder: Path, fifo: bool) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    shards = _shards(folder)
    (folder / "train-0.jsonl").write_text(shards[0])
    shard1 = folder / "train-1.jsonl"
    if fifo:
        os.mkfifo(shard1)
    else:
        shard1.write_text(shards[1])
    return [*CONFIG, "--set", f"torchtitan.args.dataloader.dataset_path={folder}",
            "--set", "torchtitan.args.dataloader.dataset=streamed_test",
            "--set", "torchtitan.override_imports=[tests.support.streamed_dataset.streamed_dataset]",
            # its own data loader: the project's resharding one (which claims the same node) stays off
            "--set", "checkpoint.on_world_size_change=restart_data",
            "--set", f"environment.env.PYTHONPATH={REPO}"]


class Feeder(threading.Thread):
    """Serves the FIFO: the first reader gets FEED_LINES lines and then nothing (no EOF); the later ones all."""

    def __init__(self, fifo: Path, text: str) -> None:
        super().__init__(daemon=True)
        self.fifo, self.text, self.held = fifo, text, threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        first = True
        while not self.done.is_set():
            fd = os.open(self.fifo, os.O_WRONLY)  # blocks until a rank opens its shard
            try:
                data = self.text if not first else "".join(self.text.splitlines(keepends=True)[:FEED_LINES])
                _write_all(fd, data.encode())
                if first:
                    first = False
                    self.held.set()
                    poller = select.poll()
                    poller.register(fd, select.POLLERR)
                    while not self.done.is_set() and not poller.poll(500):  # POLLERR: the reader was killed
                        pass
            except BrokenPipeError:
                pass
            finally:
                os.close(fd)

    def stop(self) -> None:
        """End the thread; a writer still blocked in open() is let go by a reader that opens and leaves."""
        self.done.set()
        with contextlib.suppress(OSError):
            os.close(os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK))
        self.join(10)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def test_a_rank_blocked_in_its_data_loader_is_found_and_the_run_recovers(cli: Cli, tmp_path: Path) -> None:
    reference = uninterrupted_losses(cli, STEPS, *_dataset_config(tmp_path / "regular", fifo=False))
    config = _dataset_config(tmp_path / "fifo", fifo=True)
    feeder = Feeder(tmp_path / "fifo" / "train-1.jsonl", _shards(tmp_path)[1])
    feeder.start()
    try:
        # a blocked read is no stop: the step budget names it (a floor of 20 s, not the default 45 s, for the suite)
        job = cli.submit(*config, "--set", "watchdog.step_floor_s=20", paced=True)
        wait_for(feeder.held.is_set, 600, "rank 1 to read its shard", 1)
        status = cli.wait(job, timeout=900)
    finally:
        feeder.stop()
    assert status["state"] == "COMPLETED", status
    first = status["attempts"][0]
    host = cli.status(job)["attempts"][0]["hosts"][1]
    assert re.fullmatch(rf"hung on {host} rank 1 at step \d+ \(step\)", first["cause"]), first
    hang = hang_report(cli.job_dir(job), 0)
    assert not hang["frozen"] and hang["in_collective"] is False  # blocked in read(), not waiting for a peer
    stack = rank_stack(cli.job_dir(job), 0, 1)
    assert "read" in stack and "distributed_c10d" not in stack, stack
    assert_same_training(cli, job, reference)
