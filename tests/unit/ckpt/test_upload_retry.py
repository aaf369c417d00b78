"""What the uploader sends again when the store refused part of an upload (slurm_titan.ckpt.upload), and what the
committer reads while it polls for receipts (slurm_titan.ckpt.commit.ReceiptPoll)."""

from __future__ import annotations

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import read_manifest
from slurm_titan.ckpt.commit import ReceiptPoll
from slurm_titan.ckpt.manifest import Receipt
from slurm_titan.ckpt.storage import LocalStore, TransientStoreError, open_store
from slurm_titan.ckpt.upload import CheckpointSync
from tests.support.ckpt import write_fake_step


class RefusesOneFileOnce(LocalStore):
    """A folder whose first upload stores every file but one, then fails as a store does once a part's policy is
    used up."""

    def __init__(self, root: str, refused: str) -> None:
        super().__init__(root, root)
        self.refused, self.calls = refused, []

    def _upload_many(self, items, algorithm, progress, spans, uploaded):
        self.calls.append([rel for _, rel in items])
        if len(self.calls) > 1:
            return super()._upload_many(items, algorithm, progress, spans, uploaded)
        super()._upload_many([i for i in items if i[1] != self.refused], algorithm, progress, spans, uploaded)
        raise TransientStoreError(f"{self.location}: cannot upload {self.refused}: SlowDown (still refused after "
                                  f"1800 s and 412 tries)", throttle="SlowDown")


def test_a_retry_sends_only_the_files_not_stored_whole(tmp_path):
    store = RefusesOneFileOnce(str(tmp_path / "remote"), refused="step-3/attempt-a/__0_0.distcp")
    sync = CheckpointSync(store, str(tmp_path / "local"), attempt="a", retry_initial=0.01, poll_interval=0.01)
    files = write_fake_step(tmp_path / "local", 3, world_size=1)
    sync.submit(3)
    assert sync.wait(3, timeout=30), sync.status(3)
    assert sync.close(timeout=30)
    assert store.calls == [["step-3/attempt-a/.metadata", "step-3/attempt-a/__0_0.distcp"],
                           ["step-3/attempt-a/__0_0.distcp"]]
    assert {f.path: f.size for f in read_manifest(store, 3).files} == {name: len(b) for name, b in files.items()}


def test_a_poll_reads_only_its_attempts_receipts_each_once_unless_changed(tmp_path):
    store = open_store(str(tmp_path / "remote"), create=True)
    for rank in range(4):  # left by an earlier attempt, in its own folder
        store.put_bytes(layout.receipt_path(5, rank, "old"), Receipt(5, rank, 4, "old", [], "xxh3_128").to_json())
    read: list[list[str]] = []
    cat_many = store.cat_many
    store.cat_many = lambda rels: (read.append(sorted(rels)), cat_many(rels))[1]  # type: ignore[method-assign]
    poll = ReceiptPoll(store, 5, 4, "new")
    for rank in range(4):  # this attempt's ranks write theirs, one after the other
        assert poll.gather() is None
        store.put_bytes(layout.receipt_path(5, rank, "new"), Receipt(5, rank, 4, "new", [], "xxh3_128").to_json())
    got = poll.gather()
    assert read == [[layout.receipt_path(5, r, "new") for r in range(4)]]  # none of the earlier attempt's
    assert got is not None and [(r.rank, r.attempt) for r in got] == [(r, "new") for r in range(4)]
    read.clear()
    failed = Receipt(5, 2, 4, "new", [], "xxh3_128", failed="disk full")  # rank 2 rewrites its receipt
    store.put_bytes(layout.receipt_path(5, 2, "new"), failed.to_json())
    assert [r.failed for r in poll.gather() or []] == ["", "", "disk full", ""]
    assert read == [[layout.receipt_path(5, 2, "new")]]
