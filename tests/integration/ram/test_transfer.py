"""Snapshots between two nodes' memory folders through the real snapshot server (HTTP on loopback): a push lands
sealed, a pull verifies each file, and a wrong token, a snapshot of another run or a damaged file are refused in
one line with nothing sealed; a push is received at the background priority, a pull served at training's."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from slurm_titan.ram import layout, snapshot, transfer
from slurm_titan.ram.transfer import SnapshotServer, TransferError, pull, push
from slurm_titan.thread_priority import BACKGROUND_NICE

RUN = "4711:abc"


def sealed(root: Path, step: int, rank: int, data: bytes, run: str = RUN) -> Path:
    staging = layout.step_dir(root, step) / f".rank-{rank}.1"
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(data)
    (staging / ".metadata").write_bytes(b"meta" * 10)
    final = layout.rank_dir(root, step, rank)
    snapshot.seal(staging, snapshot.Manifest.of_folder(staging, run=run, step=step, rank=rank, world_size=2), final)
    return final


@pytest.fixture
def nodes(tmp_path: Path):  # noqa: ANN201
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    servers = [SnapshotServer(a, RUN, 2).start(), SnapshotServer(b, RUN, 2).start()]
    yield a, b, servers
    for server in servers:
        server.close()


def test_a_pushed_snapshot_is_sealed_on_the_partner_and_pulled_back_whole(nodes) -> None:  # noqa: ANN001
    a, b, (_, server_b) = nodes
    data = bytes(range(256)) * 5000
    own = sealed(a, 10, 0, data)
    assert push(own, "127.0.0.1", server_b.port, server_b.token) == len(data) + 40
    assert snapshot.holdings(b, run=RUN, world_size=2) == {10: [0]}
    assert (layout.rank_dir(b, 10, 0) / "__0_0.distcp").read_bytes() == data
    c = a.parent / "c"
    assert pull("127.0.0.1", server_b.port, server_b.token, c, run=RUN, step=10, rank=0, world_size=2) == len(data) + 40
    assert not snapshot.problem(layout.rank_dir(c, 10, 0), run=RUN, step=10, rank=0, world_size=2)


def test_a_wrong_token_another_runs_snapshot_or_a_missing_one_is_refused_and_nothing_is_sealed(nodes) -> None:  # noqa: ANN001
    a, b, (server_a, server_b) = nodes
    own = sealed(a, 10, 0, b"x" * 1000)
    with pytest.raises(TransferError, match="HTTP 403"):
        push(own, "127.0.0.1", server_b.port, "not-the-token")
    assert snapshot.holdings(b, run=RUN, world_size=2) == {}
    sealed(a, 12, 1, b"y" * 10, run="999:other")
    with pytest.raises(TransferError, match=r"answered for step 12 rank 1 with a snapshot of another run \(999:other"):
        pull("127.0.0.1", server_a.port, server_a.token, b, run=RUN, step=12, rank=1, world_size=2)
    with pytest.raises(TransferError, match="HTTP 404"):
        pull("127.0.0.1", server_a.port, server_a.token, b, run=RUN, step=14, rank=0, world_size=2)
    assert snapshot.holdings(b, run=RUN, world_size=2) == {}


def test_a_file_that_does_not_match_its_digest_is_refused_and_nothing_is_sealed(nodes) -> None:  # noqa: ANN001
    _, b, (_, server_b) = nodes
    response = transfer._request("127.0.0.1", server_b.port, server_b.token, "PUT", "/step-10/rank-0/data", b"abc",
                                 {"Content-Length": "3", transfer.DIGEST: transfer.digest_of(b"abd")})
    assert response.status == 400
    assert f"data: XXH3-64 {transfer.digest_of(b'abc')}, the sender's" in response.read().decode()
    assert snapshot.holdings(b, run=RUN, world_size=2) == {}


def test_an_incomplete_folder_is_not_held(tmp_path: Path) -> None:
    own = sealed(tmp_path, 10, 0, b"z" * 100)
    (own / "__0_0.distcp").write_bytes(b"z" * 99)  # cut short
    assert snapshot.holdings(tmp_path, run=RUN, world_size=2) == {}
    assert "has 99 bytes, its manifest says 100" in snapshot.problem(own, run=RUN, step=10, rank=0, world_size=2)


def test_a_partners_push_is_received_at_the_background_nice_and_a_recoverys_pull_served_at_trainings(
        nodes, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    a, b, (server_a, server_b) = nodes
    nice: dict[str, int] = {}

    def noting(what: str, real):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if threading.current_thread() is not threading.main_thread():  # the server's request thread
                nice[what] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(snapshot, "seal", noting("put", snapshot.seal))
    monkeypatch.setattr(transfer, "file_digest", noting("get", transfer.file_digest))
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    push(sealed(a, 10, 0, b"x" * 1000), "127.0.0.1", server_b.port, server_b.token)
    pull("127.0.0.1", server_b.port, server_b.token, a.parent / "c", run=RUN, step=10, rank=0, world_size=2)
    assert nice == {"put": min(19, own + BACKGROUND_NICE), "get": own}
