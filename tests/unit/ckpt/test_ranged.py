"""A file filled by ranges that land in any order (the S3 restore's ranged downloads): the bytes on
disk and the checksum are the file's, with O_DIRECT writes or without, whatever the budget."""

from __future__ import annotations

import os

import pytest

from slurm_titan.ckpt.checksum import hash_bytes
from slurm_titan.ckpt.storage import ranged

PART = 2 * ranged.ALIGN
ORDER = [3, 1, 6, 0, 5, 2, 7, 4]  # the ranges' landing order; range 7 is the unaligned tail


def _fill(path, data: bytes, budget: ranged.Budget, order: list[int],
          direct: bool = True) -> tuple[ranged.RangedFile, list]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, len(data))
    buffers = ranged.PartBuffers(PART)
    handed_back = []
    f = ranged.RangedFile(fd, str(path), "xxh3_128", budget, direct=direct)
    try:
        for i in order:
            off = i * PART
            n = min(PART, len(data) - off)
            buf = buffers.take()
            buf[:n] = data[off:off + n]
            f.write(off, memoryview(buf)[:n])
            handed_back += f.landed(off, n, buf)
    finally:
        f.close()
        os.close(fd)
    return f, handed_back


@pytest.mark.parametrize("budget_parts", [0, 1, 8])
@pytest.mark.parametrize("direct", [True, False])
def test_ranges_written_and_hashed_in_file_order(tmp_path, budget_parts, direct):
    data = os.urandom(7 * PART + 123)
    budget = ranged.Budget(budget_parts * PART)
    f, handed_back = _fill(tmp_path / "f", data, budget, ORDER, direct)
    assert (tmp_path / "f").read_bytes() == data
    assert f.checksum() == (len(data), hash_bytes(data, "xxh3_128"))
    assert len(handed_back) == len(ORDER) and budget.left == budget_parts * PART
    assert f.direct_ok is (direct and _direct_supported(tmp_path))  # the path named is the path taken


def _direct_supported(folder) -> bool:
    fd = ranged._open_direct(str(folder / "f"))
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def test_a_buffer_that_o_direct_refuses_is_written_through_the_page_cache(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    f = ranged.RangedFile(fd, str(tmp_path / "f"), "xxh3_128", ranged.Budget(0))
    try:
        if not f.direct_ok:
            pytest.skip(f"{tmp_path}: no O_DIRECT on this file system")
        data = os.urandom(PART)
        odd = memoryview(bytearray(PART + 1))[1:]  # not aligned: O_DIRECT says EINVAL
        odd[:] = data
        f.write(0, odd)
        assert not f.direct_ok and (tmp_path / "f").read_bytes() == data
    finally:
        f.close()
        os.close(fd)


def test_a_failed_range_frees_the_budget_of_early_ones(tmp_path):
    data = os.urandom(4 * PART)
    budget = ranged.Budget(8 * PART)
    f, handed_back = _fill(tmp_path / "f", data, budget, [1, 2, 3])  # range 0 never lands
    assert handed_back == [] and f.hashed == 0 and budget.left == 8 * PART


@pytest.mark.parametrize(("env", "direct"), [(None, True), ("1", True), ("0", False)])
def test_direct_io_can_be_turned_off(monkeypatch, env, direct):
    from slurm_titan.ckpt.storage import TransferConfig

    if env is None:
        monkeypatch.delenv("SLURM_TITAN_CKPT_DIRECT_IO", raising=False)
    else:
        monkeypatch.setenv("SLURM_TITAN_CKPT_DIRECT_IO", env)
    assert TransferConfig.from_env().direct_io is direct


@pytest.mark.parametrize("direct", [True, False])
def test_directory_restore_writes_past_the_page_cache(tmp_path, monkeypatch, direct):
    """The directory restore writes with O_DIRECT (nothing left for a sync to flush: the buffered
    copy plus its sync swung from 0.26x to 0.96x of ``cp -r`` + ``sync``); the bytes, an unaligned
    tail included, and the checksum are the source's, and buffered writes are still there."""
    from slurm_titan.ckpt.storage import TransferConfig, local, open_store

    opened = []
    real = ranged._open_direct

    def spy(path):
        fd = real(path)
        opened.append((path, fd >= 0))
        return fd

    monkeypatch.setattr(ranged, "_open_direct", spy)
    data = os.urandom(3 * local._DIRECT_BUF + 1234)
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "f.distcp").write_bytes(data)
    store = open_store(str(tmp_path / "remote"), transfer=TransferConfig(direct_io=direct))
    out = tmp_path / "local" / "f.distcp"
    assert store.download_many([("f.distcp", str(out), len(data))]) == [
        (len(data), hash_bytes(data, "xxh3_128"))]
    assert out.read_bytes() == data
    assert [p for p, _ in opened] == ([str(out)] if direct else [])
