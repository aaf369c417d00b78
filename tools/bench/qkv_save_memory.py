#!/usr/bin/env python3
"""Benchmark: the memory a checkpoint save takes per rank for torchtitan's fused QKV weights, with and without
slurm-titan's hook.

    .venv/bin/python -m tools.bench.qkv_save_memory                       # 2 ranks, 8 layers
    .venv/bin/python -m tools.bench.qkv_save_memory --ranks 4 --layers 4

Measured: a real save on the CPU (one gloo process per rank) of a stack of torchtitan ``FusedQKVLinear`` layers
whose weights are FSDP-like shards (DTensor Shard(0)), through torchtitan's ``CheckpointManager`` (the reference)
and slurm-titan's ``SyncedCheckpointManager``, built and saved in one process each. Reported per rank: the bytes
of the model's state-dict cache (torchtitan's ``ModelWrapper``, alive for the whole run) and the peak of the
bytes of the storages the save's ops allocate (a dispatch mode counting them until they are freed), each divided by
the bytes of every layer's whole QKV weight; and the ratio slurm-titan / torchtitan.

Modelled: the same quantities for llama3 70B at ``configs/llama3_70b_npu.yaml``'s degrees (TP 8 in a node, FSDP
over 8 nodes; fp32 weights), from the shapes: the whole QKV weight of all layers, what each path keeps and
what it allocates at its peak (the measured run checks this arithmetic on the small shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
MANAGERS = ("torchtitan", "slurm-titan")


@dataclass(frozen=True)
class QkvShapes:
    """The fused QKV weights of a model: ``layers`` x ``(n_kv * (n_heads / n_kv + 2) * head_dim, dim)``."""

    layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    bytes_per_value: int = 4

    @property
    def rows(self) -> int:
        return self.n_kv_heads * (self.n_heads // self.n_kv_heads + 2) * self.head_dim

    @property
    def layer_bytes(self) -> int:
        return self.rows * self.dim * self.bytes_per_value

    @property
    def total_bytes(self) -> int:
        return self.layers * self.layer_bytes


LLAMA3_70B = QkvShapes(layers=80, dim=8192, n_heads=64, n_kv_heads=8, head_dim=128)
"""torchtitan 0.3.0's llama3_70b: 80 layers, dim 8192, 64 heads, 8 KV heads (head_dim 128)."""


def modelled(shapes: QkvShapes, first_dim: int) -> dict[str, dict[str, float]]:
    """Bytes per rank, modelled: ``cache`` (the state-dict cache, alive from the manager's start) and ``peak`` (the
    most a save allocates above that); both paths gather each layer whole on every rank, whatever the mesh.
    ``first_dim``: the ranks of the mesh's first dimension, over which the tensors are saved as Shard(0).

    torchtitan: ``state_dict()`` gathers every layer whole and keeps its split copies (``total``), so the cache holds
    ``total`` and a save makes ``total`` anew, plus the last layer's gathered weight before its split. slurm-titan
    (:func:`slurm_titan.rank.replicated.shard_split_qkv`): a layer's gathered weight and split copies are freed once
    its shards (``layer / first_dim``) are made, so the cache and a save's fresh dict hold ``total / first_dim`` and
    the peak is the other layers' shards plus one layer gathered and split."""
    total, layer = shapes.total_bytes, shapes.layer_bytes
    return {
        "torchtitan": {"cache": total, "peak": total + layer},
        "slurm-titan": {"cache": total / first_dim, "peak": (total - layer) / first_dim + 2 * layer},
    }


# -- one rank ---------------------------------------------------------------------------------
def _layers(shapes: QkvShapes, mesh):  # noqa: ANN001, ANN202 - torch types: imported in the rank only
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor
    from torchtitan.models.common.attention import FusedQKVLinear
    from torchtitan.models.common.linear import Linear

    torch.manual_seed(0)
    config = FusedQKVLinear.Config(head_dim=shapes.head_dim, n_heads=shapes.n_heads, n_kv_heads=shapes.n_kv_heads,
                                   wqkv=Linear.Config(in_features=shapes.dim, out_features=shapes.rows))
    model = torch.nn.ModuleList([config.build() for _ in range(shapes.layers)])
    for layer in model:
        weight = layer.wqkv.weight
        layer.wqkv.weight = torch.nn.Parameter(distribute_tensor(weight.detach(), mesh, [Shard(0)]))
    return model


def _live_bytes_mode():  # noqa: ANN202 - a TorchDispatchMode subclass, made in the rank (torch imported there)
    """A dispatch mode counting the bytes of the storages ops allocate while it is on, alive now and at most.
    Garbage that only the cycle collector frees is collected before a new peak is recorded, so that the peak is
    what the save holds, not what depends on when the collector happened to run (under load, at other times)."""
    import gc
    import weakref

    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def storages(tree: object) -> dict[int, torch.UntypedStorage]:
        """The storages of the tensors in ``tree`` (a DTensor's: its local tensor's), by address."""
        found = {}
        for t in tree_leaves(tree):
            t = t._local_tensor if isinstance(t, DTensor) else t
            if isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.untyped_storage().nbytes():
                found[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return found

    class LiveBytes(TorchDispatchMode):
        """Counts each storage an op returns that none of its inputs has (views and in-place results alias one)."""

        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, int] = {}
            self.now = self.peak = 0

        def _freed(self, key: int) -> None:
            self.now -= self.live.pop(key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            out = func(*args, **(kwargs or {}))
            inputs = storages((args, kwargs))
            for key, storage in storages(out).items():
                if key not in inputs and key not in self.live:
                    if self.now + storage.nbytes() > self.peak:
                        gc.collect()
                    self.live[key] = storage.nbytes()
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, key)
            return out

    return LiveBytes()


def measure_rank(manager: str, shapes: QkvShapes, folder: str) -> dict[str, int]:
    """Build ``manager`` over the layers and save step 1 (RANK, WORLD_SIZE, MASTER_* set): the bytes of its
    state-dict cache and the peak the save allocates."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, init_device_mesh
    from torchtitan.components.checkpointer import MODEL, CheckpointManager

    from slurm_titan.rank import checkpointer

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _layers(shapes, mesh)
    config = CheckpointManager.Config(enable=True, folder="ckpt", interval=1)
    if manager == "slurm-titan":
        config = checkpointer.synced_checkpoints(config)
    mgr = config.build(dataloader=None, model_parts=[model], optimizers=None, lr_schedulers=None, states={},
                       sd_adapter=None, base_folder=folder)
    cache = mgr.states[MODEL].cached_state_dict
    cache_bytes = sum((v._local_tensor if isinstance(v, DTensor) else v).untyped_storage().nbytes()
                      for k, v in cache.items() if ".w" in k)
    with _live_bytes_mode() as counted:
        mgr.save(1)
    mgr.close()
    dist.barrier()
    dist.destroy_process_group()
    return {"cache": cache_bytes, "peak": counted.peak}


# -- driver -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(manager: str, shapes: QkvShapes, ranks: int) -> list[dict[str, int]]:
    """Run :func:`measure_rank` on ``ranks`` gloo processes; their results, by rank."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   WORLD_SIZE=str(ranks))
        procs = [subprocess.Popen([sys.executable, "-m", "tools.bench.qkv_save_memory", "--rank-of", manager,
                                   "--layers", str(shapes.layers), "--dim", str(shapes.dim), "--out",
                                   f"{tmp}/rank-{r}.json", "--folder", f"{tmp}/{manager}-{r}"],
                                  env=dict(env, RANK=str(r)), cwd=REPO) for r in range(ranks)]
        if any(p.wait(timeout=600) for p in procs):
            raise RuntimeError(f"a rank of the {manager} save failed")
        return [json.loads(Path(f"{tmp}/rank-{r}.json").read_text()) for r in range(ranks)]


def _small(layers: int, dim: int) -> QkvShapes:
    return QkvShapes(layers=layers, dim=dim, n_heads=8, n_kv_heads=2, head_dim=dim // 8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--rank-of", choices=MANAGERS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shapes = _small(args.layers, args.dim)
    if args.rank_of:
        Path(args.out).write_text(json.dumps(measure_rank(args.rank_of, shapes, args.folder)))
        return 0
    print(f"measured: {args.ranks} gloo ranks, {shapes.layers} fused QKV layers of {shapes.rows}x{shapes.dim} fp32 "
          f"(all layers: {shapes.total_bytes / 2**20:.1f} MiB = 1.00); per rank, the largest over ranks")
    model = modelled(shapes, first_dim=args.ranks)
    got = {m: {k: max(r[k] for r in measure(m, shapes, args.ranks)) for k in ("cache", "peak")} for m in MANAGERS}
    for key in ("cache", "peak"):
        old, new = got["torchtitan"][key], got["slurm-titan"][key]
        print(f"  {key:5}  torchtitan {old / shapes.total_bytes:5.2f}  slurm-titan {new / shapes.total_bytes:5.2f}"
              f"  ratio {new / old:4.2f}   (modelled: {model['torchtitan'][key] / shapes.total_bytes:4.2f}, "
              f"{model['slurm-titan'][key] / shapes.total_bytes:4.2f})")
    big = modelled(LLAMA3_70B, first_dim=8)  # the mesh (dp_shard 8, tp 8): Shard(0) over the 8 nodes
    print(f"modelled, llama3 70B (TP 8 x FSDP 8, fp32 QKV of all layers: {LLAMA3_70B.total_bytes / GB:.1f} GB), "
          "per rank:")
    for m in MANAGERS:
        print(f"  {m:11}  cache {big[m]['cache'] / GB:5.1f} GB, a save's peak above it {big[m]['peak'] / GB:5.1f} GB,"
              f" both {(big[m]['cache'] + big[m]['peak']) / GB:5.1f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
