"""Resume on another node count with the data position resharded (issue 15), on the bundled Slurm cluster.

A first job trains 6 steps (checkpoints at 3 and 6) on one node count, a second resumes its step 6 on another:
its node log says so and that the data loader reshards the data position; on more nodes, each node fetches only
what its new ranks' DCP load reads (fewer nodes: test_restore_share). (On the same node count the resharding
loader is what every checkpointed job runs: the preemption, recovery and hang tests compare every loss after a
resume with an uninterrupted run's.) The rank log of the second says the data position was resharded; the data
loader entries of the checkpoints (restored from the store, read with DCP) show that what was unconsumed at step
6 is a superset of what is unconsumed at step 9 and that no sample left between them was read twice. Both jobs
train on the debug documents led by their ids (tests/support/sample_ids.py) and record, per rank, the tokens of
every batch their loader yielded (tests/support/loader_record.py): read back as samples, no sample's token was
consumed twice over the two jobs and none is missing up to the last consumed one. The jobs pack sequences of
SEQ_LEN tokens (tests.support.configs) from documents of 22-238 tokens, so each checkpoint cuts documents
mid-sequence: the cut ones go on at their token offset. (tests/integration/overrides/test_loader_record.py runs
these jobs' loaders in one process, with the same data, batch for batch.) The same cases on pre-tokenized token
shards of the same documents (`slurm-titan data prepare`; issue 28), from a folder and from the store: the same
guarantees, through the token-shard loader.
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
from tests.support.runs import assert_fetched_what_new_ranks_read, job_dir, step_losses
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


@pytest.mark.parametrize(("first_nodes", "second_nodes", "per_node", "shards"),
                         [(2, 1, 1, None), (1, 2, 1, None), (2, 4, 1, None), (2, 1, 2, None), (1, 2, 2, None),
                          (2, 1, 1, "folder"), (1, 2, 1, "folder"), (2, 4, 1, "s3")])
def test_resume_on_another_node_count_reshards_the_data(cli: Cli, tmp_path: Path, first_nodes: int,
                                                         second_nodes: int, per_node: int, shards: str | None) -> None:
    dataset = write_dataset(tmp_path / "ids")
    data = (_token_shards(cli, dataset, shards, tmp_path / "shards") if shards
            else ["--set", f"torchtitan.args.dataloader.dataset_path={dataset}"])
    common = ["--set", f"slurm.devices_per_node={per_node}", "--set", "checkpoint.interval=3", *data,
              "--set", "torchtitan.override_imports=[tests.support.loader_record.record_yielded_batches]",
              "--set", f"environment.env.PYTHONPATH={REPO}"]
    first = cli.submit(*SMALL_STEPS, "--nodes", str(first_nodes), "--set", "torchtitan.args.training.steps=6", *common)
    assert cli.wait(first)["state"] == "COMPLETED"
    remote = cli.remote.format(name="debug-cpu", job_id=first)
    second = cli.submit(*SMALL_STEPS, "--nodes", str(second_nodes), "--set", "torchtitan.args.training.steps=9",
                        *common, "--set", f"checkpoint.remote={remote}")
    assert cli.wait(second)["state"] == "COMPLETED"
    rank0 = job_dir(cli, second) / "logs/rank-0.log"
    old, new = first_nodes * per_node, second_nodes * per_node
    assert f"data position resharded from {old} to {new} data-parallel ranks" in rank0.read_text(errors="replace")
    assert [step for step, _ in step_losses(rank0)] == [7, 8, 9]
    node_log = (job_dir(cli, second) / f"{second}_0_log.out").read_text()
    assert f"saved by {old} ranks on {new} ranks" in node_log
    assert "the data position is resharded by the data loader" in node_log
    # on more nodes (fewer: test_restore_share), from a checkpoint in pieces: one saved by a single rank holds
    # each tensor whole, and DCP reads a saved piece whole
    if second_nodes > first_nodes and old > 1:
        total = json.loads(cli("ckpt", "show", remote, "6", "--json").stdout)["total_bytes"]
        assert_fetched_what_new_ranks_read(cli, second, second_nodes, per_node, total)
    degree6, left6 = unconsumed(cli, remote, 6, tmp_path / "a")
    degree9, left9 = unconsumed(cli, remote, 9, tmp_path / "b")  # the second job saved where it resumed from
    assert (degree6, degree9) == (old, new)
    assert len(left6) == len(set(left6)) and len(left9) == len(set(left9))  # each unconsumed sample on one rank
    assert set(left9) < set(left6)  # nothing consumed at step 6 comes back; steps 7-9 consumed some more
    read = set(left6) - set(left9)
    # 3 steps x a local batch of tokens per rank; documents have >= 20 tokens: at most this many read
    assert 0 < len(read) <= 3 * LOCAL_BATCH * SEQ_LEN * new // 20 + new
    tokenizer, _ = ensure_assets(REPO / ".cache/debug-assets")  # the debug config's (debug_assets)
    yielded = recorded(job_dir(cli, first)), recorded(job_dir(cli, second))
    assert tuple(map(len, yielded)) == (old, new)  # every rank recorded
    runs = check_resumed(Samples.load(dataset, tokenizer), *yielded)
    assert sum(end - start for _, start, end in runs) == (6 * old + 3 * new) * LOCAL_BATCH * SEQ_LEN  # 6 + 3 steps

