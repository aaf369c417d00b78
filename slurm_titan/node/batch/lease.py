"""Take the checkpoint location's writer lease before any node starts, and renew it while the job lives (runs in the
batch shell; ckpt.lease is the protocol).

The batch set-up runs `python -m slurm_titan.node.batch.lease --job-dir DIR` before the first attempt, every time
the job starts (a requeued job takes its own lease again): a lease another job holds ends the job here, with one
line naming the holder, its state in Slurm and how to take over, before any rank writes. Then it starts
`... --renew-while PID` in the background, which renews the lease every ckpt.lease.RENEW_S while the batch shell
(PID) lives; a lease that another job took (:class:`LeaseLost`) ends this job (scancel): two jobs never write
one location knowingly; one that a later run of this job took (a requeue while this run's host was cut off) ends
this run's batch shell only. A job whose batch spec names no lease (its location is its own) does nothing here.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path

from slurm_titan import slurm
from slurm_titan.ckpt import (
    LEASE_RENEW_S,
    Holder,
    Lease,
    LeaseLost,
    Store,
    open_store,
    read_lease,
    renew_lease,
    take_lease,
)
from slurm_titan.errors import SlurmTitanError
from slurm_titan.node.batch.processes import alive
from slurm_titan.node.batch_spec import LeasePlan, load_or_exit
from slurm_titan.records.run_folder import fill


def say(line: str) -> None:
    print(f"slurm-titan: {line}", file=sys.stderr, flush=True)


def holder() -> Holder:
    """This job as a lease holder: its id, its run (SLURM_RESTART_COUNT), the batch host."""
    return Holder(os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_RESTART_COUNT", "0"), socket.gethostname())


def _store(plan: LeasePlan) -> Store:
    return open_store(fill(plan.remote, os.environ["SLURM_JOB_ID"]), endpoint_url=plan.endpoint_url, check=True,
                      create=True)


def take(plan: LeasePlan) -> None:
    """Take the lease for this job (LeaseRefused when another job holds it)."""
    store = _store(plan)
    lease, why = take_lease(store, holder(), slurm.state_name, take_over=plan.take_over)
    say(f"writer lease of {store.url()} taken (generation {lease.generation}: {why})")


def renew_while(plan: LeasePlan, pid: int, every_s: float = LEASE_RENEW_S) -> int:
    """Renew this job's lease while `pid` (the batch shell) lives; when another job took it, scancel this job; when
    a later run of this job took it (a requeue while this run's host was cut off), end this run's batch shell only,
    not the job (exit 1 both)."""
    store = _store(plan)
    me = holder()
    held: Lease | None = read_lease(store).lease
    due = time.monotonic() + every_s
    while alive(pid):
        time.sleep(min(1.0, every_s))
        if time.monotonic() < due:
            continue
        due = time.monotonic() + every_s
        try:
            if held is None or held.holder != me:
                raise LeaseLost(f"{store.url()}: the writer lease is {held.holder if held else 'gone'}'s, not "
                                f"{me}'s", held.holder if held else None)
            held = renew_lease(store, held)
        except LeaseLost as error:
            if error.taker is not None and error.taker.job == me.job:
                say(f"{error}: ending this run's batch shell (pid {pid}); job {me.job} goes on in its later run")
                os.kill(pid, signal.SIGTERM)
            else:
                say(f"{error}: cancelling job {me.job}, which must not write there any more")
                slurm.run(["scancel", me.job], check=False)
            return 1
        except SlurmTitanError as error:  # the store, for now: the lease lasts ckpt.lease.TTL_S
            say(f"could not renew the writer lease ({error}); trying again in {every_s:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--renew-while", type=int, metavar="PID", help="renew the lease while PID lives")
    args = parser.parse_args(argv)
    plan = load_or_exit(args.job_dir).lease
    if plan is None:
        return 0
    try:
        if args.renew_while is not None:
            return renew_while(plan, args.renew_while)
        take(plan)
    except SlurmTitanError as error:
        say(str(error))
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
