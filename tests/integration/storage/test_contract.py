"""The storage contract: what the checkpoint code relies on, run on every backend (fsspec's
``tests/abstract`` style: one suite, one small fixtures class per backend).

Backends: a local folder; fsspec ``memory://`` (the generic backend); SeaweedFS and moto (an
emulator that enforces If-None-Match), each on both S3 data paths (``http``: http.client with
presigned URLs; ``fsspec``: s3fs) as explicit parameters. A new backend gets the whole contract
from a class of a few lines: a ``store`` fixture (a fresh, empty location) and, where it can be
unreachable, an ``unreachable`` one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from slurm_titan.ckpt.checksum import DEFAULT_ALGORITHM, hash_bytes
from slurm_titan.ckpt.storage import (
    LocalFileError,
    RangeReader,
    Store,
    StoreError,
    TransferConfig,
    TransientStoreError,
    is_transient,
    open_store,
    s3_http,
)
from slurm_titan.errors import StorageError
from tests.support.s3 import clean_env
from tools.local_s3.moto_server import Server as MotoServer
from tools.local_s3.moto_server import find_moto_server, free_port

SMALL = TransferConfig(part_size=5 << 20, concurrency=3, file_concurrency=2, block_size=1 << 20)
"""Parts of S3's smallest size, so that a few MiB make multipart uploads and ranged downloads."""

DATA_PATHS = ["http", "fsspec"]


def _one_line_without_secrets(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, msg
    for k in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"):
        assert not os.environ.get(k) or os.environ[k] not in msg, msg
    return msg


class StoreContract:
    """The tests; a subclass supplies ``store`` (and ``unreachable``) fixtures."""

    atomic_create = True
    """Whether two concurrent exclusive creates are guaranteed one winner (memory:// checks, then writes)."""

    @pytest.fixture
    def unreachable(self) -> Store:
        pytest.skip("this backend has no endpoint to lose")

    def test_is_a_store(self, store):
        assert isinstance(store, Store) and store.ls("") == [] and store.find("") == []
        reader = store._range_reader()  # the one Protocol-shaped seam: a rename shows here
        assert isinstance(reader, RangeReader)
        reader.close()

    def test_put_cat_exists(self, store):
        assert not store.exists("a/b.json")
        store.put_bytes("a/b.json", b"one")
        assert store.exists("a/b.json") and store.cat("a/b.json") == b"one"
        store.put_bytes("a/b.json", b"two")  # replaced
        assert store.cat("a/b.json") == b"two"
        with pytest.raises(FileNotFoundError):
            store.cat("a/missing.json")
        assert store.cat_many(["a/b.json", "a/missing.json"]) == {"a/b.json": b"two", "a/missing.json": None}

    def test_ls_and_find(self, store):
        for rel, data in {"top.json": b"t", "step-1/x.distcp": b"xx", "step-1/sub/y.distcp": b"yyy",
                          "step-2/z.distcp": b"z"}.items():
            store.put_bytes(rel, data)
        assert [(e.name, e.is_dir) for e in store.ls("")] == [("step-1", True), ("step-2", True), ("top.json", False)]
        assert [(e.path, e.is_dir) for e in store.ls("step-1")] == [("step-1/sub", True), ("step-1/x.distcp", False)]
        assert [(e.path, e.size) for e in store.find("step-1")] == [("step-1/sub/y.distcp", 3), ("step-1/x.distcp", 2)]
        assert [e.path for e in store.find("")] == ["step-1/sub/y.distcp", "step-1/x.distcp", "step-2/z.distcp",
                                                   "top.json"]
        assert store.ls("nope") == [] and store.find("nope") == []

    def test_rm_files_and_rm_tree(self, store):
        for rel in ("step-1/a", "step-1/sub/b", "step-2/c", "keep.json"):
            store.put_bytes(rel, b"x")
        store.rm_files(["step-2/c", "step-2/never-there"])
        assert not store.exists("step-2/c")
        store.rm_tree("step-1")
        store.rm_tree("step-2")
        assert [e.name for e in store.ls("")] == ["keep.json"]  # no folder left behind, not even a marker
        with pytest.raises(StorageError, match="refusing to delete the whole location"):
            store.rm_tree("")

    def test_create_bytes_refuses_to_overwrite(self, store):
        assert store.create_bytes("step-1/.slurm-titan/commit.json", b"first")
        assert not store.create_bytes("step-1/.slurm-titan/commit.json", b"second")
        assert store.cat("step-1/.slurm-titan/commit.json") == b"first"

    def test_concurrent_creates_have_one_winner(self, store):
        if not self.atomic_create:
            pytest.skip("this backend's exclusive create is check-then-write")
        with ThreadPoolExecutor(6) as pool:
            wins = list(pool.map(lambda i: store.create_bytes("commit.json", b"%d" % i), range(6)))
        assert sum(wins) == 1 and store.cat("commit.json") == b"%d" % wins.index(True)

    def test_bulk_upload_download_checksum(self, store, tmp_path):
        files = {"step-1/__0_0.distcp": os.urandom((11 << 20) + 77),  # multipart on S3, ranged on the way back
                 "step-1/__1_0.distcp": os.urandom(3000), "step-1/sub/__2_0.distcp": os.urandom((1 << 20) + 5),
                 "step-1/.metadata": b""}
        for rel, data in files.items():
            (tmp_path / "up" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "up" / rel).write_bytes(data)
        big = files["step-1/__0_0.distcp"]
        spans = {"step-1/__0_0.distcp": [(0, 100), (5 << 20, 4096)]}
        moved: list[int] = []
        entries = store.upload_many([(str(tmp_path / "up" / rel), rel) for rel in files], moved.append, spans=spans)
        assert [(e.path, e.size, e.checksum) for e in entries] == [(r, len(d), hash_bytes(d)) for r, d in files.items()]
        assert sum(moved) == sum(map(len, files.values()))
        block = SMALL.block_size
        assert entries[0].block_size == block
        assert entries[0].blocks == tuple(hash_bytes(big[i:i + block]) for i in range(0, len(big), block))
        assert entries[0].spans == ((0, 100, hash_bytes(big[:100])),
                                    (5 << 20, 4096, hash_bytes(big[5 << 20:(5 << 20) + 4096])))
        assert {e.path: e.size for e in store.find("step-1")} == {r: len(d) for r, d in files.items()}

        moved.clear()
        back = store.download_many([(rel, str(tmp_path / "down" / rel), len(d)) for rel, d in files.items()],
                                   moved.append)
        assert back == [(len(d), hash_bytes(d)) for d in files.values()] and sum(moved) == sum(map(len, files.values()))
        for rel, data in files.items():
            assert (tmp_path / "down" / rel).read_bytes() == data
        sums = store.checksum_many([(rel, len(d)) for rel, d in files.items()] + [("step-1/gone.distcp", None)],
                                   DEFAULT_ALGORITHM)
        assert sums[:-1] == [(len(d), hash_bytes(d)) for d in files.values()]
        assert isinstance(sums[-1], StorageError) and "step-1/gone.distcp" in _one_line_without_secrets(sums[-1])

    def test_download_pieces_checks_each_range(self, store, tmp_path):
        data = os.urandom(5 * 4096 + 123)
        (tmp_path / "f").write_bytes(data)
        store.upload_many([(str(tmp_path / "f"), "step-1/f.distcp")])
        good = [(0, 4096), (8192, 5000), (len(data) - 123, 123)]
        pieces = [(off, n, hash_bytes(data[off:off + n])) for off, n in good] + [(4096, 100, "not-the-checksum")]
        out = tmp_path / "got" / "f.distcp"
        assert store.download_pieces([("step-1/f.distcp", str(out), len(data), pieces)], DEFAULT_ALGORITHM) == [
            [(4096, 100)]]
        got = out.read_bytes()
        assert len(got) == len(data) and got[4096:8192] == bytes(4096)  # a bad piece is never written
        for off, n in good:
            assert got[off:off + n] == data[off:off + n]

    def test_read_ranges_reads_small_ranges_into_memory(self, store, tmp_path):
        data = os.urandom(3 * 4096 + 7)
        store.put_bytes("step-1/a.distcp", data)
        store.put_bytes("step-1/b.distcp", data[::-1])
        wanted = [("step-1/a.distcp", 0, 8), ("step-1/b.distcp", 4090, 20), ("step-1/a.distcp", len(data) - 7, 7)]
        assert store.read_ranges(wanted) == [data[:8], data[::-1][4090:4110], data[-7:]]
        with pytest.raises(StorageError) as e:
            store.read_ranges([("step-1/a.distcp", len(data) - 4, 8)])  # past the end: short
        _one_line_without_secrets(e.value)

    def test_failures_are_one_line_without_secrets(self, store, tmp_path):
        with pytest.raises(StorageError) as e:
            store.download_many([("step-1/no-such.distcp", str(tmp_path / "x"), None)])
        assert store.location in _one_line_without_secrets(e.value)
        with pytest.raises(LocalFileError):  # the local side: not the store's fault, not retried
            store.upload_many([(str(tmp_path / "not-there"), "step-1/x.distcp")])

    def test_an_unreachable_store_is_transient(self, unreachable, tmp_path):
        with pytest.raises(TransientStoreError) as e:
            unreachable.ls("")
        assert "cannot connect" in _one_line_without_secrets(e.value)
        (tmp_path / "f").write_bytes(b"x" * 1000)
        with pytest.raises(TransientStoreError):
            unreachable.upload_many([(str(tmp_path / "f"), "f")])
        with pytest.raises(TransientStoreError):
            unreachable.download_many([("f", str(tmp_path / "g"), None)])


@pytest.mark.parametrize(("exc", "transient"), [
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
    (OSError(errno.ECONNRESET, "reset"), True),
    (TimeoutError("timed out"), True),
    (TransientStoreError("x"), True),
    (StoreError("x"), False),
    (PermissionError(errno.EACCES, "denied"), False),
    (ValueError("bad"), False),
])
def test_transient_classification(exc, transient):
    assert is_transient(exc) is transient


@pytest.mark.parametrize(("code", "transient"), [("SlowDown", True), ("503", True), ("InternalError", True),
                                                 ("AccessDenied", False), ("NoSuchKey", False)])
def test_transient_classification_of_s3_codes(code, transient):
    from botocore.exceptions import ClientError

    assert is_transient(ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")) is transient


# ------------------------------------------------------------------------------------------ backends


class TestLocal(StoreContract):
    @pytest.fixture
    def store(self, tmp_path, monkeypatch):
        clean_env(monkeypatch)
        return open_store(str(tmp_path / "location"), create=True, transfer=SMALL)


class TestMemory(StoreContract):
    atomic_create = False

    @pytest.fixture
    def store(self, monkeypatch):
        clean_env(monkeypatch)
        store = open_store(f"memory://contract-{uuid.uuid4().hex[:10]}/run", transfer=SMALL)
        yield store
        with contextlib.suppress(FileNotFoundError):  # memory:// lives as long as the process
            store.fs.rm(store.root, recursive=True)


class S3Fixtures(StoreContract):
    """An S3 server (``server`` fixture: ``env()``, ``endpoint``) on both data paths."""

    @pytest.fixture(params=DATA_PATHS)
    def data_path(self, request, monkeypatch):
        monkeypatch.setattr(s3_http, "_RANGED_MIN", 1 << 20)  # ranged downloads of a few MiB
        return request.param

    @pytest.fixture
    def store(self, server, data_path, monkeypatch):
        clean_env(monkeypatch)
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        return open_store(f"s3://{server.bucket}/contract-{uuid.uuid4().hex[:10]}", transfer=SMALL,
                          data_path=data_path)

    @pytest.fixture
    def unreachable(self, server, data_path, monkeypatch):
        clean_env(monkeypatch)
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        return open_store(f"s3://{server.bucket}/x", endpoint_url=f"http://127.0.0.1:{free_port()}", check=False,
                          transfer=SMALL, data_path=data_path)


@pytest.mark.s3
class TestSeaweedFS(S3Fixtures):
    @pytest.fixture
    def server(self, s3_server):
        return s3_server


@pytest.fixture(scope="module")
def moto_server():
    try:
        find_moto_server()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with MotoServer(port=free_port()) as srv:
        yield srv


@pytest.mark.s3
class TestMoto(S3Fixtures):
    @pytest.fixture
    def server(self, moto_server):
        return moto_server
