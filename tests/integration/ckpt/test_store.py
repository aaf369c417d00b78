"""Opening locations: atomic create, one-line errors for unreachable stores and bad credentials."""

from __future__ import annotations

import socket

import pytest

from slurm_titan.ckpt.storage import StoreError, open_store
from slurm_titan.ckpt.upload import CheckpointSync
from slurm_titan.cli.main import main as ckpt_main
from slurm_titan.errors import StorageError
from tests.support.s3 import clean_env


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_create_bytes_is_exclusive(location):
    store = open_store(location, create=True)
    assert store.create_bytes("step-1/.slurm-titan/commit.json", b"first")
    assert not store.create_bytes("step-1/.slurm-titan/commit.json", b"second")
    assert store.cat("step-1/.slurm-titan/commit.json") == b"first"
    store.put_bytes("a/b.json", b"x")
    assert [e.path for e in store.find("a")] == ["a/b.json"]
    assert [(e.name, e.is_dir) for e in store.ls("")] == [("a", True), ("step-1", True)]
    with pytest.raises(FileNotFoundError):
        store.cat("nope.json")
    store.rm_tree("step-1")
    assert [e.name for e in store.ls("")] == ["a"]


def test_unreachable_store_at_start_is_one_line(monkeypatch, tmp_path):
    clean_env(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(StorageError) as e:
        open_store("s3://bucket/run", endpoint_url=endpoint)
    msg = str(e.value)
    assert "\n" not in msg and "s3://bucket/run" in msg and "cannot connect" in msg
    assert "EXAMPLEKEY" not in msg
    assert e.value.exit_code == 4
    with pytest.raises(StorageError, match="cannot connect"):
        CheckpointSync("s3://bucket/run", str(tmp_path), endpoint_url=endpoint)


def test_cli_reports_unreachable_store(monkeypatch, capsys):
    clean_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    assert ckpt_main(["ckpt", "list", "s3://bucket/run"]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("slurm-titan: s3://bucket/run:") and len(err.splitlines()) == 1


@pytest.mark.s3
def test_bad_credentials_and_missing_bucket(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "definitely-the-wrong-secret")
    with pytest.raises(StorageError) as e:
        open_store(s3_env.url("run"))
    assert "access denied" in str(e.value) and "definitely-the-wrong-secret" not in str(e.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.secret_key)
    with pytest.raises(StorageError, match="bucket does not exist"):
        open_store("s3://no-such-bucket-here/run")


@pytest.mark.s3
def test_explicit_storage_options_are_not_shown(s3_server, monkeypatch):
    clean_env(monkeypatch)
    opts = dict(s3_server.storage_options(), secret="wrong-" + s3_server.secret_key)
    with pytest.raises(StoreError) as e:
        open_store(s3_server.url("x"), storage_options=opts)
    assert opts["secret"] not in str(e.value) and s3_server.secret_key not in repr(e.value)
    store = open_store(s3_server.url("x"), storage_options=s3_server.storage_options())
    assert s3_server.secret_key not in repr(store)


def test_local_location_must_exist_unless_created(tmp_path):
    with pytest.raises(StorageError, match="no such folder"):
        open_store(str(tmp_path / "missing"))
    store = open_store(str(tmp_path / "made"), create=True)
    assert store.ls("") == []
