"""The writer lease against a real folder and the SeaweedFS server: jobs racing for it (exactly one wins), expiry,
renewal, a lost lease, take-over (refused while the holder runs in Slurm: a recorded state here), a corrupt
generation."""

from __future__ import annotations

import threading

import pytest

from slurm_titan.ckpt import (
    Holder,
    LeaseLost,
    LeaseRefused,
    layout,
    open_store,
    read_lease,
    renew_lease,
    take_lease,
)
from tests.support.ckpt import location  # noqa: F401 (fixture)

RUNNING = {"1": "RUNNING", "2": "RUNNING"}


def _states(states):
    return lambda job: states.get(job)


def test_of_jobs_racing_for_a_free_lease_exactly_one_wins(location):
    store = open_store(location, check=True, create=True)
    jobs = [str(100 + i) for i in range(8)]
    start, won, refused = threading.Barrier(len(jobs)), [], []

    def race(job):
        start.wait()
        try:
            won.append(take_lease(store, Holder(job), _states(dict.fromkeys(jobs, "RUNNING")))[0])
        except LeaseRefused as error:
            refused.append(str(error))

    threads = [threading.Thread(target=race, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == len(jobs) - 1
    winner = won[0].holder.job
    assert all(f"job {winner} (run 0) writes here (RUNNING in Slurm)" in line for line in refused), refused
    assert read_lease(store).lease == won[0]


def test_a_lease_is_renewed_by_its_holder_and_expires_without_renewal(location):
    store = open_store(location, check=True, create=True)
    lease, why = take_lease(store, Holder("1", "0", "n1"), _states(RUNNING), ttl=60, clock=lambda: 1000.0)
    assert (why, lease.generation, lease.expires_at) == ("free", 1, 1060.0)
    renewed = renew_lease(store, lease, ttl=60, clock=lambda: 1030.0)
    assert (renewed.generation, renewed.expires_at, renewed.taken_at) == (2, 1090.0, 1000.0)
    assert [e.name for e in store.ls(layout.LEASE_DIR)] == ["g-0000000002.json"]  # the one below is deleted
    with pytest.raises(LeaseRefused, match="job 1 .* writes here"):
        take_lease(store, Holder("2"), _states(RUNNING), clock=lambda: 1080.0)
    taken, why = take_lease(store, Holder("2"), _states(RUNNING), clock=lambda: 1091.0)
    assert taken.generation == 3 and why == "job 1 (run 0 on n1)'s lease expired 1 s ago"
    with pytest.raises(LeaseLost, match="job 2 .* took the writer lease .* from job 1"):
        renew_lease(store, renewed)


def test_a_requeued_job_takes_its_own_lease_again(location):
    store = open_store(location, check=True, create=True)
    take_lease(store, Holder("1", "0"), _states(RUNNING))
    lease, why = take_lease(store, Holder("1", "1"), _states(RUNNING))
    assert lease.generation == 2 and why == "held by this job's run 0"


def test_take_over_is_refused_while_the_holder_runs_and_taken_when_slurm_does_not_know_it(location):
    store = open_store(location, check=True, create=True)
    take_lease(store, Holder("1"), _states(RUNNING))
    with pytest.raises(LeaseRefused, match="RUNNING in Slurm.*slurm-titan cancel 1"):
        take_lease(store, Holder("2"), _states(RUNNING), take_over=True)
    with pytest.raises(LeaseRefused, match=r"job 1 \(run 0\) holds the writer lease for \d+ s more \(NODE_FAIL\).*"
                                           "--take-over"):
        take_lease(store, Holder("2"), _states({"1": "NODE_FAIL"}))
    lease, why = take_lease(store, Holder("2"), _states({}), take_over=True)
    assert lease.holder.job == "2" and why == "taken over from job 1 (run 0) (unknown to Slurm)"
    lease, why = take_lease(store, Holder("3"), _states({"2": "CANCELLED"}))  # an ended holder: no take-over needed
    assert lease.generation == 3 and why == "job 2 ended (CANCELLED)"


def test_a_corrupt_lease_is_named_and_taken_only_with_take_over(location):
    store = open_store(location, check=True, create=True)
    store.put_bytes(layout.lease_path(4), b"{not json")
    with pytest.raises(LeaseRefused, match=r"g-0000000004.json: corrupt lease \(not JSON.*--take-over"):
        take_lease(store, Holder("2"), _states({}))
    lease, why = take_lease(store, Holder("2"), _states({}), take_over=True)
    assert lease.generation == 5 and why == "taken over from the corrupt generation 4"


class _StaleFirstRead:
    """The store as a writer that stalled sees it: its first listing and read of the lease are those of `before`
    (taken earlier), everything else is the store's own."""

    def __init__(self, store, before: dict[str, bytes]) -> None:
        self._store, self._before = store, before

    def ls(self, path):
        return [_Named(name) for name in self._before] if self._before else self._store.ls(path)

    def cat(self, path):
        name = path.rsplit("/", 1)[-1]
        if name in self._before:
            return self._before.pop(name)
        return self._store.cat(path)

    def __getattr__(self, name):
        return getattr(self._store, name)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_a_writer_that_stalled_never_holds_a_generation_a_newer_writer_pruned(location):
    """Job 2 lists the lease at generation 1 (expired), stalls; job 1 renews twice (generations 2 and 3, the lower
    ones pruned); job 2 wakes and creates generation 2 again. It is not the highest: job 2 deletes it and is
    refused by job 1's generation 3, so no two jobs ever believe they hold the lease."""
    store = open_store(location, check=True, create=True)
    first, _ = take_lease(store, Holder("1"), _states(RUNNING), ttl=60, clock=lambda: 1000.0)
    stale = {layout.lease_path(1).rsplit("/", 1)[-1]: store.cat(layout.lease_path(1))}
    held = renew_lease(store, renew_lease(store, first, clock=lambda: 1030.0), clock=lambda: 1060.0)
    assert held.generation == 3
    with pytest.raises(LeaseRefused, match="job 1 .* writes here"):
        take_lease(_StaleFirstRead(store, stale), Holder("2"), _states(RUNNING), clock=lambda: 1070.0)
    assert [e.name for e in store.ls(layout.LEASE_DIR)] == ["g-0000000003.json"]
    assert read_lease(store).lease == held
