"""One rank of the DCP share tests (tests/integration/ckpt/test_dcp_share.py): ``save`` a small sharded state
with DCP (gloo, CPU) and upload it with its read map; ``load`` it back from a node's share and from
the whole checkpoint and write what was loaded; ``replicated``: a replicated DTensor saved and loaded as is and as
shards; ``reshard``: the same load on another world size than the
save's (``SAVED_WORLD``), as a rank of a gated RankGroup: answer the node's plan requests at the restore
gate first, then write what it planned, what ``dcp.load`` read and what was loaded. Run as
``python -m tests.support.dcp_share_worker save|load|reshard ...`` with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set (as the node supervisor starts a rank), or forked with them by ``forked`` from a process that
imported torch already (the tests' fork server: a rank's start-up without torch's import, ~3 s of CPU)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh


def state(world: int, rank: int, mesh, filled: bool) -> dict:
    """A small training state shaped like torchtitan's: sharded parameters and optimizer moments
    (DTensors), a replicated tensor and train state (deduplicated into one rank's file at save),
    and a per-rank data loader position. ``world``: the saving world size (the global shapes)."""
    g = torch.Generator().manual_seed(1234)

    def value(*shape):
        t = torch.randn(*shape, generator=g)
        return t if filled else torch.zeros_like(t)

    w1, w2, m1 = value(64 * world, 48), value(40, 24 * world), value(64 * world, 48)
    return {
        "model": {"w1": distribute_tensor(w1, mesh, [Shard(0)]), "w2": distribute_tensor(w2, mesh, [Shard(1)]),
                  "norm": value(700)},
        "optimizer": {"exp_avg.w1": distribute_tensor(m1, mesh, [Shard(0)])},
        "train_state": {"step": 7 if filled else 0, "note": "x" * (300 if filled else 1)},
        "dataloader": {f"dp_rank_{rank}": torch.full((900,), float(rank) if filled else -1.0)},
    }


def plain(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = plain(v)
        elif isinstance(v, torch.Tensor):
            t = v.to_local() if hasattr(v, "to_local") else v
            out[k] = t.flatten().tolist()
        else:
            out[k] = v
    return out


class RecordingReader(FileSystemReader):
    """FileSystemReader noting the byte ranges ``dcp.load`` reads."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.read: list[tuple[str, int, int]] = []

    def read_data(self, plan, planner):  # noqa: ANN001, ANN201
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            self.read.append((info.relative_path, int(info.offset), int(info.length)))
        return super().read_data(plan, planner)


def reshard(rank: int, mesh, share_dir: str, whole_dir: str, out: str) -> None:  # noqa: ANN001
    """Load a checkpoint saved by SAVED_WORLD ranks as torchtitan does on another world size (the data
    loader excluded): plan at the gate, then load from the node's share and from the whole checkpoint."""
    from slurm_titan.ckpt.share import merged
    from slurm_titan.rank.dcp_plan import check_share, folder_reads
    from slurm_titan.rank.restore_gate import wait_for_restore

    saved = int(os.environ["SAVED_WORLD"])

    def fresh() -> dict:
        sd = state(saved, rank, mesh, filled=False)
        del sd["dataloader"]
        return sd

    sd = fresh()
    planned: list = []

    def plan(folder: str) -> list:
        planned.append(folder_reads(sd, folder))
        return planned[-1]

    verdict = wait_for_restore(plan)
    assert verdict is not None and verdict.world_size_changed
    check_share(share_dir, sd)
    reader = RecordingReader(share_dir)
    dcp.load(sd, storage_reader=reader)
    whole = fresh()
    dcp.load(whole, checkpoint_id=whole_dir)
    filled = state(saved, rank, mesh, filled=True)
    del filled["dataloader"]
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump({"planned": planned, "read": merged(reader.read), "share": plain(sd), "whole": plain(whole),
                   "saved": plain(filled)}, f)


def replicated(rank: int, mesh, old_dir: str, new_dir: str, out: str) -> None:  # noqa: ANN001
    """A replicated DTensor saved as DCP keeps it (one copy, read whole by every rank) and as
    slurm_titan.rank.replicated.sharded gives it (each rank's rows); both loaded back through ``sharded`` into a
    replicated tensor, as torchtitan's load hooks and ``copy_`` take them: the chunks saved, the bytes each rank
    read and whether the values came back."""
    from torch.distributed.tensor import Replicate

    from slurm_titan.rank.replicated import sharded

    full = torch.randn(50, 64, generator=torch.Generator().manual_seed(7))
    saved = {"wq": distribute_tensor(full, mesh, [Replicate()]), "norm": torch.ones(3)}
    dcp.save(saved, checkpoint_id=old_dir)
    dcp.save(sharded(saved), checkpoint_id=new_dir)
    result: dict = {}
    for name, folder in (("old", old_dir), ("new", new_dir)):
        target = {"wq": distribute_tensor(torch.zeros_like(full), mesh, [Replicate()]), "norm": torch.zeros(3)}
        loading = sharded(target)
        reader = RecordingReader(folder)
        dcp.load(loading, storage_reader=reader)
        with torch.no_grad():
            target["wq"].copy_(loading["wq"])
        chunks = FileSystemReader(folder).read_metadata().state_dict_metadata["wq"].chunks
        equal = torch.equal(target["wq"].to_local(), full) and torch.equal(loading["norm"], saved["norm"])
        result[name] = {"chunks": len(chunks), "read": sum(n for _, _, n in reader.read), "equal": equal,
                        "placements": [str(p) for p in loading["wq"].placements]}
    with open(out, "w") as f:
        json.dump(result, f)


def forked(argv: list[str], env: dict[str, str], log: str) -> None:
    """``main`` with `argv` in a process forked from one that imported this module: `env` set and the output to
    `log` first."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # OpenMP read its variable at import
    sys.exit(main(argv))


def main(argv: list[str]) -> int:
    op, local, remote, out = argv[:4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    if op == "save":
        from slurm_titan.ckpt.storage import TransferConfig
        from slurm_titan.ckpt.upload import CheckpointSync
        from slurm_titan.rank.dcp_plan import load_reads, small_items

        sd = state(world, rank, mesh, filled=True)
        md = dcp.save(sd, checkpoint_id=os.path.join(local, "step-1"))
        reads = load_reads(sd, md)
        sync = CheckpointSync(remote, local, rank=rank, world_size=world, attempt="t", poll_interval=0.05)
        sync.submit(1, reads, small_items(md, rank, TransferConfig.from_env().block_size))
        ok = sync.close(timeout=120)
        dist.barrier()
        with open(out, "w") as f:
            json.dump({"ok": ok, "reads": reads}, f)
    elif op == "load":
        from slurm_titan.rank.dcp_plan import check_share

        share_dir, whole_dir = local, remote
        loaded = {}
        for name, folder in (("share", share_dir), ("whole", whole_dir)):
            sd = state(world, rank, mesh, filled=False)
            check_share(folder, sd)
            dcp.load(sd, checkpoint_id=folder)
            loaded[name] = plain(sd)
        loaded["saved"] = plain(state(world, rank, mesh, filled=True))
        with open(out, "w") as f:
            json.dump(loaded, f)
    elif op == "replicated":
        replicated(rank, mesh, local, remote, out)
    else:
        reshard(rank, mesh, local, remote, out)
    dist.barrier()  # no rank tears the group down while another still finishes its last collective
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
