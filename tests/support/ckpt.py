"""Checkpoint test helpers: files shaped like a torchtitan DCP step folder, and the `location` fixture, fsspec-style:
one test body, run against a plain directory and against the SeaweedFS server."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from slurm_titan.ckpt.catalog import read_manifest
from slurm_titan.ckpt.storage import Store
from tests.support.s3 import clean_env


@pytest.fixture(params=["dir", pytest.param("s3", marks=pytest.mark.s3)])
def location(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty checkpoint location: a directory, or s3://<bucket>/<unique prefix> (with
    AWS_* pointing at the shared server)."""
    if request.param == "dir":
        clean_env(monkeypatch)
        return str(tmp_path / "remote")
    srv = request.getfixturevalue("s3_env")
    return srv.fresh_url()


def write_fake_step(local_folder: str | os.PathLike, step: int, world_size: int, size: int = 4096,
                    seed: int = 0) -> dict[str, bytes]:
    """Files shaped like one torchtitan DCP step folder: ``__R_0.distcp`` per rank + ``.metadata``.

    Returns {name: content}."""
    rng = random.Random(hash((step, world_size, seed)))
    d = Path(local_folder) / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    files = {f"__{r}_0.distcp": rng.randbytes(size + r) for r in range(world_size)}
    files[".metadata"] = b"fake dcp metadata step %d seed %d" % (step, seed)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return files


def committed_key(store: Store, step: int, name: str) -> str:
    """The object of file `name` of committed step `step` (in the folder of the attempt its record names)."""
    return read_manifest(store, step).key(name)
