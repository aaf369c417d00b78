"""Resume on another node count with the data position resharded (issue 15), on the bundled Slurm cluster.

Each case is a chain of jobs: a first job trains 6 steps (checkpoints at 3 and 6) on one node count, and each
later job resumes the last checkpoint of the job before on another node count and trains 3 more (1 -> 2 nodes
of 1 rank: more, from a one-rank checkpoint; 2 -> 1 -> 2 nodes of 2 ranks: fewer, then more from pieces; 2 -> 4
nodes of 1 rank from pieces on token shards below: each link is one of the cases a pair of jobs was before). Of
every link: its node log says so and that the data loader reshards the data position; on more nodes, each node
fetches only what its new ranks' DCP load reads (fewer nodes: test_restore_share). (On the same node count the
resharding loader is what every checkpointed job runs: the preemption, recovery and hang tests compare every loss
after a resume with an uninterrupted run's.) The rank log of the resumed job says the data position was resharded; the
data loader entries of the checkpoints (restored from the store, read with DCP) show that what was unconsumed at
the checkpoint it resumed is a superset of what is unconsumed 3 steps later and that no sample left between them
was read twice. Every job trains on the debug documents led by their ids (tests/support/sample_ids.py) and
records, per rank, the tokens of every batch its loader yielded (tests/support/loader_record.py): read back as
samples, no sample's token was consumed twice over the chain's jobs and none is missing up to the last consumed
one. The jobs pack sequences of SEQ_LEN tokens (tests.support.configs) from documents of 22-238 tokens, so each
checkpoint cuts documents mid-sequence: the cut ones go on at their token offset. (tests/integration/overrides/
test_loader_record.py runs these jobs' loaders in one process, with the same data, batch for batch.) The same
links on pre-tokenized token shards of the same documents (`slurm-titan data prepare`; issue 28), from a folder
and from the store: the same guarantees, through the token-shard loader.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from slurm_titan.data.cursor import epoch0_rows, pieces_from_tuples, remaining
from slurm_titan.launch.debug_assets import ensure_assets
from tests.support.cli import Cli
from tests.support.configs import LOCAL_BATCH, SEQ_LEN, SMALL_STEPS
from tests.support.paths import REPO
from tests.support.runs import assert_fetched_what_new_ranks_read, step_losses
from tests.support.sample_ids import Samples, check_resumed, recorded, write_dataset

pytestmark = [pytest.mark.cluster, pytest.mark.train]


def unconsumed(cli: Cli, remote: str, step: int, into: Path) -> tuple[int, list[int]]:
    """(data-parallel degree, rows not yet consumed) of a committed checkpoint, from its data loader entry."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    cli("ckpt", "restore", remote, "--step", str(step), "--to", into)
    raw = _load_state_dict_from_keys({"dataloader.world_size"}, checkpoint_id=str(into / f"step-{step}"))
    saved = pickle.loads(raw["dataloader"]["world_size"])
    rows = []
    for part in saved["ranks"]:
        cursor = pickle.loads(part)
        rows += epoch0_rows(remaining(pieces_from_tuples(cursor["pieces"]), cursor["first"], cursor["offset"]))
    return saved["dp_world_size"], rows


def _token_shards(cli: Cli, dataset: Path, shards: str, into: Path) -> list[str]:
    """The job options that train on token shards of `dataset` (slurm-titan data prepare), kept in a folder or
    (`shards == "s3"`) at the store, read through each node's cache."""
    tokenizer = REPO / ".cache/debug-assets/tokenizer"
    ensure_assets(REPO / ".cache/debug-assets")
    location = cli.remote.format(name="token-shards", job_id=into.parent.name) if shards == "s3" else str(into)
    upload = ["--upload", location] if shards == "s3" else []
    cli("data", "prepare", dataset, "--tokenizer", tokenizer, "--output", into, "--documents-per-shard", "100",
        *upload, timeout=300)
    return ["--set", "torchtitan.args.dataloader.dataset=token_shards",
            "--set", f"torchtitan.args.dataloader.dataset_path={location}",
            "--set", f"environment.env.SLURM_TITAN_DATA_CACHE={into.parent / 'cache'}"]


FIRST_STEPS, LINK_STEPS = 6, 3


@pytest.mark.parametrize(("nodes", "per_node", "shards"),
                         [((1, 2), 1, None), ((2, 1, 2), 2, None), ((2, 1), 1, "folder"), ((2, 4), 1, "s3")],
                         ids=["text-1-2", "text-2x2-1x2-2x2", "folder-2-1", "s3-2-4"])
def test_resume_on_another_node_count_reshards_the_data(cli: Cli, tmp_path: Path, nodes: tuple[int, ...],
                                                         per_node: int, shards: str | None) -> None:
    dataset = write_dataset(tmp_path / "ids")
    data = (_token_shards(cli, dataset, shards, tmp_path / "shards") if shards
            else ["--set", f"torchtitan.args.dataloader.dataset_path={dataset}"])
    common = [*SMALL_STEPS, "--set", f"slurm.devices_per_node={per_node}", "--set", "checkpoint.interval=3", *data,
              "--set", "torchtitan.override_imports=[tests.support.loader_record.record_yielded_batches]",
              "--set", f"environment.env.PYTHONPATH={REPO}"]
    first = cli.submit(*common, "--nodes", str(nodes[0]), "--set", f"torchtitan.args.training.steps={FIRST_STEPS}")
    assert cli.wait(first)["state"] == "COMPLETED"
    remote = cli.remote.format(name="debug-cpu", job_id=first)
    jobs, step = [first], FIRST_STEPS
    left = {step: unconsumed(cli, remote, step, tmp_path / f"at{step}")}
    for before, count in zip(nodes, nodes[1:]):
        job = cli.submit(*common, "--nodes", str(count), "--set", f"torchtitan.args.training.steps={step + LINK_STEPS}",
                         "--set", f"checkpoint.remote={remote}")  # the chain's location: it resumes the newest
        assert cli.wait(job)["state"] == "COMPLETED"
        _check_link(cli, job, remote, step, before * per_node, count, per_node)
        left[step + LINK_STEPS] = unconsumed(cli, remote, step + LINK_STEPS, tmp_path / f"at{step + LINK_STEPS}")
        _check_unconsumed(left[step], left[step + LINK_STEPS], before * per_node, count * per_node)
        jobs.append(job)
        step += LINK_STEPS
    tokenizer, _ = ensure_assets(REPO / ".cache/debug-assets")  # the debug config's (debug_assets)
    yielded = [recorded(cli.job_dir(job)) for job in jobs]
    assert [len(streams) for streams in yielded] == [count * per_node for count in nodes]  # every rank recorded
    runs = check_resumed(Samples.load(dataset, tokenizer), *yielded)
    ranks_steps = FIRST_STEPS * nodes[0] * per_node + LINK_STEPS * sum(nodes[1:]) * per_node
    assert sum(end - start for _, start, end in runs) == ranks_steps * LOCAL_BATCH * SEQ_LEN


def _check_link(cli: Cli, job: str, remote: str, resumed: int, old: int, nodes: int, per_node: int) -> None:
    """Job `job` on `nodes` nodes resumed step `resumed`, saved by `old` ranks, and resharded its data position."""
    new = nodes * per_node
    rank0 = cli.job_dir(job) / "logs/rank-0.log"
    assert f"data position resharded from {old} to {new} data-parallel ranks" in rank0.read_text(errors="replace")
    assert [step for step, _ in step_losses(rank0)] == list(range(resumed + 1, resumed + LINK_STEPS + 1))
    node_log = (cli.job_dir(job) / f"{job}_0_log.out").read_text()
    assert f"saved by {old} ranks on {new} ranks" in node_log
    assert "the data position is resharded by the data loader" in node_log
    # on more nodes (fewer: test_restore_share), from a checkpoint in pieces: one saved by a single rank holds
    # each tensor whole, and DCP reads a saved piece whole
    if new > old > 1:
        total = json.loads(cli("ckpt", "show", remote, str(resumed), "--json").stdout)["total_bytes"]
        assert_fetched_what_new_ranks_read(cli, job, nodes, per_node, total)


def _check_unconsumed(before: tuple[int, list[int]], after: tuple[int, list[int]], old: int, new: int) -> None:
    """The data loader entries of the checkpoint a link resumed and of the one it saved LINK_STEPS later."""
    (degree_before, left_before), (degree_after, left_after) = before, after
    assert (degree_before, degree_after) == (old, new)
    assert len(left_before) == len(set(left_before)) and len(left_after) == len(set(left_after))  # each on one rank
    assert set(left_after) < set(left_before)  # nothing consumed before comes back; the link consumed some more
    read = set(left_before) - set(left_after)
    # LINK_STEPS x a local batch of tokens per rank; documents have >= 20 tokens: at most this many read
    assert 0 < len(read) <= LINK_STEPS * LOCAL_BATCH * SEQ_LEN * new // 20 + new
