"""A checkpoint committed with a format-1 record (the read map inline, block checksums listed: written by the code
before format 2, tests/data/ckpt/format1-commit.json) still lists, shows, verifies and restores, a node's share
included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import list_checkpoints, read_manifest
from slurm_titan.ckpt.fetch_plan import Wanted
from slurm_titan.ckpt.manifest import FORMAT_1
from slurm_titan.ckpt.restore import restore_checkpoint
from slurm_titan.ckpt.share import SHARE_FILE, Share
from slurm_titan.ckpt.storage import open_store
from slurm_titan.cli.main import main as ckpt_main
from tests.support.ckpt import write_fake_step
from tests.support.paths import REPO

RECORD = REPO / "tests" / "data" / "ckpt" / "format1-commit.json"
BLOCK = 8192
SIZE = 5 * BLOCK + 100
ITEM = (3 * BLOCK + 10, 40)  # in rank 0's file, read by rank 1: its own checksum in the record


@pytest.fixture
def location(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """Step 10 of 2 ranks as the old code committed it (the same files: write_fake_step is deterministic)."""
    remote = tmp_path / "remote"
    files = write_fake_step(remote, 10, 2, size=SIZE, seed=10)
    (remote / "step-10" / layout.META_DIR).mkdir()
    (remote / "step-10" / layout.COMMIT_RECORD).write_bytes(RECORD.read_bytes())
    return str(remote), files


def test_a_format1_record_lists_shows_and_verifies(location, capsys):
    remote, files = location
    store = open_store(remote)
    [info] = list_checkpoints(store)
    assert (info.step, info.complete, info.world_size, info.files) == (10, True, 2, 3)
    m = read_manifest(store, 10)
    assert m.format == FORMAT_1 and m.parts is None and len(m.read_map) == 2
    assert ckpt_main(["ckpt", "show", remote, "10", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    old = json.loads(RECORD.read_bytes())
    assert shown == old  # the same fields, read map inline, block checksums listed
    assert ckpt_main(["ckpt", "verify", remote, "--quiet"]) == 0
    assert "OK, 3 file(s)" in capsys.readouterr().out


def test_a_format1_record_restores_a_nodes_share(location, tmp_path):
    remote, files = location
    res = restore_checkpoint(open_store(remote), str(tmp_path / "node1"), wanted=Wanted([1], 2))
    assert res.share.whole == [".metadata", "__1_0.distcp"] and res.share.spans == {"__0_0.distcp": [ITEM]}
    assert res.fetched == len(files[".metadata"]) + len(files["__1_0.distcp"]) + ITEM[1]
    folder = tmp_path / "node1" / "step-10"
    assert (folder / layout.COMMIT_RECORD).read_bytes() == RECORD.read_bytes()  # as fetched, not re-written
    share = Share.from_json((folder / layout.META_DIR / SHARE_FILE).read_bytes(), "t")
    assert share.covers("__0_0.distcp", *ITEM) and not share.covers("__0_0.distcp", 0, 10)
    assert restore_checkpoint(open_store(remote), str(tmp_path / "node1"), wanted=Wanted([1], 2)).reused
    whole = restore_checkpoint(open_store(remote), str(tmp_path / "all"))
    assert all((Path(whole.path) / p).read_bytes() == d for p, d in files.items())
