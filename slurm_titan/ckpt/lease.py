"""One writer per checkpoint location: the writer lease, a chain of create-only generations.

    <root>/.slurm-titan/lease/g-<G>.json     generation G (layout.lease_path): its holder and expiry (JSON)

The lease is its highest generation. Every change creates the next generation with
:meth:`Store.create_bytes` (the commit record's create-only write: S3 ``If-None-Match: *``, a hard link
in a folder) and nothing is ever rewritten: of two jobs that create the same generation exactly one
succeeds, and the other reads who won. A holder renews by creating the generation after its own, and only
while its own is the highest, so a holder whose lease was taken learns it at its next renewal
(:class:`LeaseLost`), and no generation has two holders. Another job takes the lease only when its
generation expired (a holder renews every :data:`RENEW_S`; a generation lasts :data:`TTL_S` by the
writer's clock: login and batch hosts' clocks are assumed within seconds of each other), when Slurm says
the holder ended (:data:`ENDED`: its processes are gone), or on ``--take-over`` when Slurm does not say
that it runs (unknown to Slurm, or NODE_FAIL: a node cut off may still run it). A new generation's writer
deletes the ones below it.

Slurm is asked through ``state_of`` (a job id to its state, None when Slurm does not know the job): this
module knows Slurm's state names, nothing else of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.storage import Store
from slurm_titan.errors import RunError, StorageError

TTL_S = 300.0
"""How long a generation lasts unless renewed."""
RENEW_S = 60.0
"""How often a holder renews (a fifth of TTL_S: four renewals may fail before the lease can be taken)."""
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                   "PREEMPTED"})
"""Slurm states of a job whose processes are gone: its lease is taken without waiting for it to expire."""
UNSURE = "NODE_FAIL"
"""The one ended state whose job may still run (on a node cut off from the controller): like a job unknown to
Slurm, its unexpired lease is taken only with ``--take-over``."""
FORMAT = 1
_TRIES = 5

StateOf = Callable[[str], str | None]
"""A job id to its Slurm state (RUNNING, CANCELLED, ...), None when Slurm does not know the job."""


class LeaseRefused(RunError):
    """Another job holds the location's lease, or the lease is corrupt: one line naming the holder (or the object)
    and what to do."""


class LeaseLost(RunError):
    """The holder's lease was taken by another job, or by a later run of its own job (a requeue), or the lease
    changed under it: `taker` the holder now (None: unreadable)."""

    def __init__(self, message: str, taker: Holder | None = None) -> None:
        super().__init__(message)
        self.taker = taker


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: the Slurm job, its run (SLURM_RESTART_COUNT: 0, then one more per requeue), the host."""

    job: str
    attempt: str = "0"
    host: str = ""

    def __str__(self) -> str:
        return f"job {self.job} (run {self.attempt}{f' on {self.host}' if self.host else ''})"


@dataclass(frozen=True)
class Lease:
    """One generation of the lease."""

    generation: int
    holder: Holder
    taken_at: float
    expires_at: float

    def to_json(self) -> bytes:
        return (json.dumps({"format": FORMAT, "generation": self.generation, "job": self.holder.job,
                            "attempt": self.holder.attempt, "host": self.holder.host, "taken_at": self.taken_at,
                            "expires_at": self.expires_at}, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, blob: bytes, generation: int) -> Lease:
        """The lease `blob` holds (generation `generation`, from its name); ValueError saying what is wrong."""
        try:
            data = json.loads(blob)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a lease of format {FORMAT}")
        if data.get("generation") != generation:
            raise ValueError(f"says generation {data.get('generation')!r}, its name {generation}")
        try:
            holder = Holder(str(data["job"]), str(data["attempt"]), str(data["host"]))
            return cls(generation, holder, float(data["taken_at"]), float(data["expires_at"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"bad or missing field {error}") from None


@dataclass(frozen=True)
class Current:
    """The lease as a listing found it: every generation there, the highest one's lease, or why it is unreadable."""

    generations: list[int]
    lease: Lease | None
    problem: str = ""

    @property
    def generation(self) -> int:
        return self.generations[-1] if self.generations else 0


def read(store: Store) -> Current:
    """The location's lease now (no generation: ``Current([], None)``)."""
    for _ in range(_TRIES):
        named = (layout.parse_lease_name(entry.name) for entry in store.ls(layout.LEASE_DIR))
        generations = sorted(g for g in named if g is not None)
        if not generations:
            return Current([], None)
        path = layout.lease_path(generations[-1])
        try:
            blob = store.cat(path)
        except FileNotFoundError:  # a newer generation's writer deleted it after the listing: list again
            continue
        try:
            return Current(generations, Lease.from_json(blob, generations[-1]))
        except ValueError as error:
            return Current(generations, None, f"{store.url(path)}: corrupt lease ({error})")
    raise StorageError(f"{store.url(layout.LEASE_DIR)}: the lease changed under {_TRIES} listings in a row")


def verdict(store: Store, current: Current, state_of: StateOf, *, me: str | None = None, take_over: bool = False,
            now: float | None = None) -> str:
    """Why job `me` (None: a job not submitted yet) may take the lease, as a phrase; LeaseRefused when it may not."""
    lease, where = current.lease, store.url()
    if current.problem:
        if take_over:
            return f"taken over from the corrupt generation {current.generation}"
        raise LeaseRefused(f"{current.problem}; after checking that no job writes to {where}, "
                           "take the lease over with --take-over")
    if lease is None:
        return "free"
    holder = lease.holder
    if holder.job == me:
        return f"held by this job's run {holder.attempt}"
    left = lease.expires_at - (time.time() if now is None else now)
    if left <= 0:
        return f"{holder}'s lease expired {-left:.0f} s ago"
    state = state_of(holder.job)
    if state in ENDED:
        return f"job {holder.job} ended ({state})"
    if state is not None and state != UNSURE:
        raise LeaseRefused(f"{where}: {holder} writes here ({state} in Slurm); wait for it to end or cancel it "
                           f"(slurm-titan cancel {holder.job}); --take-over takes only a lease whose job is not "
                           "running")
    said = state or "unknown to Slurm"
    if take_over:
        return f"taken over from {holder} ({said})"
    raise LeaseRefused(f"{where}: {holder} holds the writer lease for {left:.0f} s more ({said}); once you know "
                       "it no longer writes, take the lease over with --take-over")


def take(store: Store, holder: Holder, state_of: StateOf, *, take_over: bool = False, ttl: float = TTL_S,
         clock: Callable[[], float] = time.time) -> tuple[Lease, str]:
    """Take the location's lease for `holder`: the generation created, and why it could be taken
    (:func:`verdict`). LeaseRefused when another job holds it (or it is corrupt, without `take_over`)."""
    for _ in range(_TRIES):
        current = read(store)
        why = verdict(store, current, state_of, me=holder.job, take_over=take_over, now=clock())
        now = clock()
        lease = Lease(current.generation + 1, holder, now, now + ttl)
        if store.create_bytes(layout.lease_path(lease.generation), lease.to_json()) and _highest(store, lease):
            _prune(store, current.generations)
            return lease, why
    raise StorageError(f"{store.url(layout.LEASE_DIR)}: the lease changed under {_TRIES} tries to take it")


def renew(store: Store, held: Lease, *, ttl: float = TTL_S, clock: Callable[[], float] = time.time) -> Lease:
    """The generation after `held`, created while `held` is the highest; LeaseLost when another one is."""
    current = read(store)
    if current.generation == held.generation:
        now = clock()
        lease = replace(held, generation=held.generation + 1, expires_at=now + ttl)
        if store.create_bytes(layout.lease_path(lease.generation), lease.to_json()) and _highest(store, lease):
            _prune(store, current.generations)
            return lease
        current = read(store)
    taker = current.lease.holder if current.lease else None
    raise LeaseLost(f"{store.url()}: {taker or 'an unreadable generation'} took the writer lease (generation "
                    f"{current.generation}) from {held.holder}", taker)


def _highest(store: Store, created: Lease) -> bool:
    """Whether the generation just created is the highest: a writer that stalled between its listing and its
    create may have created a generation that a newer writer had already pruned, below that writer's own; such
    a generation is deleted again and counts as not taken."""
    if read(store).generation == created.generation:
        return True
    store.rm_files([layout.lease_path(created.generation)])
    return False


def _prune(store: Store, below: list[int]) -> None:
    """Delete the generations `below` the one just created (missing ones are no error)."""
    store.rm_files([layout.lease_path(generation) for generation in below])
