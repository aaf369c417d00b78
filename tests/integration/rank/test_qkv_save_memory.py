"""A save through the checkpoint hook on 2 gloo ranks holds each layer's gathered fused QKV weight one layer at a
time and keeps only each rank's rows (tools/bench/qkv_save_memory.py's rank worker, which counts the bytes)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")

from tools.bench.qkv_save_memory import QkvShapes, measure

SHAPES = QkvShapes(layers=4, dim=128, n_heads=8, n_kv_heads=2, head_dim=16)


def test_the_split_qkv_weights_are_kept_and_saved_as_shards():
    ranks = measure("slurm-titan", SHAPES, ranks=2)
    for rank in ranks:
        # torchtitan alone keeps every layer whole (total) and a save gathers them all again (total + one layer)
        assert rank["cache"] == SHAPES.total_bytes // 2
        assert rank["peak"] <= (SHAPES.total_bytes - SHAPES.layer_bytes) // 2 + 2 * SHAPES.layer_bytes
