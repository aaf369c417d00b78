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
