"""Restore at scale end to end: on 2 and 4 Slurm nodes each node fetches its share of the checkpoint
(its ranks' files and only the ranges of other files its ranks' DCP load reads), the losses after
the resume are the uninterrupted run's; corrupt checkpoints (a shard overwritten whole, a bad range in
one node's share) are named by `ckpt verify` and make every node fall back. On fewer nodes each node
fetches what its new ranks' load reads (planned at the restore gate; on more nodes: test_reshard). Bytes
fetched per node come from the node logs (the restore's transfer line), never from timings.

Needs the supervisor to pass the node's ranks, node index and node count and a verdict folder of
the attempt to slurm_titan.node.supervisor.restore.restore (see that function)."""

from __future__ import annotations

import json

import pytest
import s3fs

from slurm_titan.ckpt.share import is_data, merged
from tests.support.cli import Cli
from tests.support.configs import SMALL_STEPS
from tests.support.references import TWELVE_STEP_GROUP, copy_steps, remote_of
from tests.support.runs import FETCHED, assert_fetched_what_new_ranks_read, step_losses
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.cluster, pytest.mark.train]
BLOCK_KB = 1024
CONFIG = [*SMALL_STEPS, "--set", "checkpoint.interval=5",
          "--set", f"environment.env.SLURM_TITAN_CKPT_BLOCK_KB={BLOCK_KB}"]


def _record(cli: Cli, remote: str, step: int) -> dict:
    return json.loads(cli("ckpt", "show", remote, str(step), "--json").stdout)


def _object(record: dict, remote: str, name: str) -> str:
    """The S3 key (bucket/...) of file `name` of the step whose commit record is `record` (in its attempt's folder)."""
    folder = f"{record['data_dir']}/" if record.get("data_dir") else ""
    return f"{remote[5:]}/step-{record['step']}/{folder}{name}"


def _fetched(cli: Cli, job: str, nodes: int) -> list[tuple[int, int]]:
    out = []
    for k in range(nodes):
        m = FETCHED.search((cli.job_dir(job) / f"{job}_{k}_log.out").read_text())
        assert m, f"node {k} did not restore a share"
        out.append((int(m.group(3)), int(m.group(4))))
    return out


@TWELVE_STEP_GROUP
@pytest.mark.parametrize("nodes", [2, 4])
def test_same_world_size_each_node_fetches_its_share_and_losses_match(twelve_step_run, nodes: int,
                                                                      s3_server: S3Server) -> None:
    cli, job = twelve_step_run(nodes)
    remote = remote_of(cli, job)
    record = _record(cli, remote, 10)
    assert record["read_map"] and len(record["read_map"]) == nodes
    only10 = remote + "-from10"
    copy_steps(s3_server, remote, only10, [5, 10])
    resumed = cli.submit(*CONFIG, "--set", f"slurm.nodes={nodes}", "--set", "torchtitan.args.training.steps=12",
                         "--set", f"checkpoint.remote={only10}")
    assert cli.wait(resumed)["state"] == "COMPLETED"
    original = dict(step_losses(cli.job_dir(job) / "logs/rank-0.log"))
    after = step_losses(cli.job_dir(resumed) / "logs/rank-0.log")
    assert [s for s, _ in after] == [11, 12] and all(original[s] == loss for s, loss in after)
    fetched = _fetched(cli, resumed, nodes)
    total = record["total_bytes"]
    sizes = {f["path"]: f["size"] for f in record["files"]}
    for k, (got, of) in enumerate(fetched):
        assert of == total
        own = sizes[".metadata"] + sizes[f"__{k}_0.distcp"]  # one rank per node
        assert own <= got < total  # its own files and the ranges of others its load reads, never the whole
        assert got <= 1.02 * _read_bytes(record, k)  # what its rank's load reads, give or take block rounding
        # and hardly more than total/nodes: what every rank reads is .metadata and small items (the fused QKV
        # weights, replicated, are saved as shards: slurm_titan.rank.replicated; 1.08x / 1.23x before)
        assert got <= 1.05 * total / nodes


def _read_bytes(record: dict, rank: int) -> int:
    """The bytes the load of `rank` reads (its read map, overlaps counted once) and the files that are not DCP
    data: the least a node of one rank can fetch."""
    return sum(n for _, _, n in merged([tuple(r) for r in record["read_map"][rank]])) + sum(
        f["size"] for f in record["files"] if not is_data(f["path"]))


@TWELVE_STEP_GROUP
def test_fewer_nodes_each_node_fetches_what_its_new_ranks_read(twelve_step_run, s3_server: S3Server) -> None:
    """4 nodes' checkpoint resumed on 2 (more nodes: test_reshard's 2 -> 4)."""
    cli, job = twelve_step_run(4)
    remote = remote_of(cli, job)
    only10 = remote + "-to2"
    copy_steps(s3_server, remote, only10, [10])
    resumed = cli.submit(*CONFIG, "--set", "slurm.nodes=2", "--set", "torchtitan.args.training.steps=12",
                         "--set", f"checkpoint.remote={only10}")
    assert cli.wait(resumed)["state"] == "COMPLETED"
    assert_fetched_what_new_ranks_read(cli, resumed, 2, 1, _record(cli, remote, 10)["total_bytes"])
    assert [s for s, _ in step_losses(cli.job_dir(resumed) / "logs/rank-0.log")] == [11, 12]


@TWELVE_STEP_GROUP
def test_corrupt_checkpoints_are_named_and_every_node_falls_back(twelve_step_run, s3_server: S3Server) -> None:
    """On 4 nodes: step 12 with rank 1's shard overwritten whole, step 10 with a bad range that only node 0 reads;
    `ckpt verify` names each, and every node resumes from step 5."""
    nodes = 4
    cli, job = twelve_step_run(nodes)
    copy = remote_of(cli, job) + "-bad"
    copy_steps(s3_server, remote_of(cli, job), copy, [5, 10, 12])
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    fs.pipe_file(_object(_record(cli, copy, 12), copy, "__1_0.distcp"), b"garbage" * 10)
    verify = cli("ckpt", "verify", copy, "--step", "12", check=False)
    assert verify.returncode != 0 and "__1_0.distcp" in verify.stdout + verify.stderr
    record = _record(cli, copy, 10)
    block = next(f for f in record["files"] if f["path"] == "__0_0.distcp")["block_size"]
    read_by_others = {off // block for reads in record["read_map"][1:] for p, off, n in reads if p == "__0_0.distcp"
                      for off in range(off, off + n, block)}
    bad_block = next(b for b in range(len(next(f for f in record["files"] if f["path"] == "__0_0.distcp")["blocks"]))
                     if b not in read_by_others)
    shard = _object(record, copy, "__0_0.distcp")
    data = bytearray(fs.cat_file(shard))
    data[bad_block * block + 7] ^= 0xFF
    fs.pipe_file(shard, bytes(data))
    verify = cli("ckpt", "verify", copy, "--step", "10", check=False)
    assert verify.returncode != 0 and "__0_0.distcp" in verify.stdout + verify.stderr
    resumed = cli.submit(*CONFIG, "--set", f"slurm.nodes={nodes}", "--set", "torchtitan.args.training.steps=7",
                         "--set", f"checkpoint.remote={copy}")
    assert cli.wait(resumed)["state"] == "COMPLETED"
    span = f"bytes {bad_block * block}-{min((bad_block + 1) * block, len(data))} (block {bad_block})"
    for k in range(nodes):
        log = (cli.job_dir(resumed) / f"{resumed}_{k}_log.out").read_text()
        assert "resuming complete checkpoint step 5" in log, f"node {k}"
        rank_log = cli.job_dir(resumed) / "logs" / f"rank-{k}.log"
        assert "__0_0.distcp" in log + rank_log.read_text(errors="replace") and span in log + rank_log.read_text(
            errors="replace"), f"node {k} does not name the bad range"
    assert [s for s, _ in step_losses(cli.job_dir(resumed) / "logs/rank-0.log")] == [6, 7]
