"""Restore a complete checkpoint onto local disk: :func:`restore_checkpoint` (into any folder) and
:func:`prepare_resume` (on a node, before training (re)starts).

``restore_checkpoint`` never restores an incomplete checkpoint (one without a commit record,
:mod:`.commit`), verifies every checksum while downloading, and -- asked for the newest --
falls back to the previous complete checkpoint when the newest turns out corrupt, saying so.
For each candidate it works out once what to fetch (a :class:`.fetch_plan.FetchPlan` of what the
node wants, :class:`.fetch_plan.Wanted`), and the fetcher (:mod:`.fetch`) executes that plan.

``prepare_resume`` runs once per node (not per rank), before torchtitan starts::

    result = prepare_resume("s3://bucket/run-1", "/local/ckpt/run-1")   # None: fresh start

torchtitan resumes from the highest ``step-N`` folder with a ``.metadata`` in its local
``checkpoint.folder``. With node-local disks a step saved by the previous attempt may be
there without being committed (its upload cut short; other nodes' shards missing), so local
step folders newer than the restored one that carry no commit record are moved aside to
``.uncommitted-N-<time>`` (a name torchtitan does not pick up), never resumed from.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import (
    ByteCounter,
    ByteProgress,
    CheckpointInfo,
    list_checkpoints,
    newest_complete,
    read_manifest,
)
from slurm_titan.ckpt.commit import has_local_record
from slurm_titan.ckpt.fetch import CorruptCheckpoint, check_present, download, intact, read_share
from slurm_titan.ckpt.fetch_plan import WHOLE, FetchPlan, NodePlanner, Wanted
from slurm_titan.ckpt.manifest import Manifest, ManifestError
from slurm_titan.ckpt.parts import rank_reads
from slurm_titan.ckpt.share import SHARE_FILE, Share, node_share, reads_share
from slurm_titan.ckpt.storage import Store, open_store
from slurm_titan.errors import StorageError

log = logging.getLogger("slurm_titan.ckpt.restore")


@dataclass
class RestoreResult:
    step: int
    path: str
    """The restored step folder (``<dest>/step-N``)."""
    bytes: int
    world_size: int
    """How many ranks saved it (from its commit record)."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """Newer complete checkpoints that were corrupt (here or on another node), with why."""
    reused: bool = False
    """The destination already held an intact copy; nothing was downloaded."""
    fetched: int = 0
    """Bytes moved out of the store (0 when reused)."""
    share: Share | None = None
    """What of the checkpoint the folder holds when it is one node's share (None: all of it)."""


class _PlanRound:
    """The nodes' round on a candidate saved by another world size before any rank plans its load of it
    (:data:`.agree.STAGES`): planning runs collectives across the nodes (torchtitan's fused-QKV state-dict
    hook gathers), so the ranks of every node plan a candidate, or none do. A node votes once: yes when its
    ``.metadata`` is verified, no when anything before that failed."""

    def __init__(self, agree: Agreement, step: int) -> None:
        self.agree, self.step = agree, step
        self.answer: str | None = None

    def vote(self, why: str) -> str:
        """Why some node rejects the candidate ("" when none does); the first vote's answer ever after."""
        if self.answer is None:
            self.answer = self.agree(self.step, why, stage="plan")
        return self.answer


class Agreement(Protocol):
    """The nodes' verdict on each candidate checkpoint (:class:`.agree.NodeAgreement`)."""

    def __call__(self, step: int, why: str, stage: str = "step") -> str:
        """This node's verdict in round ``stage`` (why it rejects ``step``, or "") out; why some node
        rejects it, or "" when every node accepts it, back. Raises StorageError when the nodes cannot agree."""

    def abort(self, step: int, why: str) -> None:
        """This node cannot restore at all: tell the others now."""


def prepare_resume(remote: str, local_folder: str, step: int | None = None, *, wanted: Wanted = WHOLE,
                   endpoint_url: str | None = None, storage_options: dict | None = None,
                   progress: ByteProgress | None = None, agree: Agreement | None = None,
                   notice: Callable[[str], None] | None = None) -> RestoreResult | None:
    """Restore ``step`` (default: the newest complete checkpoint, falling back past corrupt ones)
    of ``remote`` into ``local_folder/step-N`` and hide newer uncommitted local steps. ``wanted``,
    ``agree``: see :func:`restore_checkpoint` (one node's share; one verdict for all).
    A store that throttles is waited out, each of its operations up to SLURM_TITAN_STORE_RETRY_S
    seconds (:mod:`.storage.backoff`), the waits said to ``notice`` (at most a line every 30 s).

    Returns what was restored (step, world size, ...), or None when the remote holds no complete
    checkpoint (a fresh start; local uncommitted steps are then hidden too). Raises StorageError
    (one line) if the remote is unreachable, or still throttles when an operation's time is up (the
    line names the object and the store's answer)."""
    store = open_store(remote, endpoint_url=endpoint_url, storage_options=storage_options, check=True, create=True,
                       notice=notice)
    result: RestoreResult | None = None
    infos = None if step is not None else list_checkpoints(store)
    if infos is None or newest_complete(infos) is not None:
        result = restore_checkpoint(store, local_folder, step=step, progress=progress,
                                    notify=lambda msg: log.warning("%s", msg), wanted=wanted, agree=agree,
                                    infos=infos)
        log.info("checkpoint step %d %s %s", result.step, "already in" if result.reused else "restored to",
                 result.path)
    hide_uncommitted(local_folder, newer_than=result.step if result else None)
    return result


def hide_uncommitted(local_folder: str, newer_than: int | None) -> list[str]:
    """Rename local ``step-N`` folders without a commit record (N > ``newer_than``, or all when
    None) to ``.uncommitted-N-<time>``; returns the new names."""
    if not os.path.isdir(local_folder):
        return []
    moved = []
    for name in sorted(os.listdir(local_folder)):
        s = layout.parse_step_dir(name)
        if s is None or (newer_than is not None and s <= newer_than):
            continue
        path = os.path.join(local_folder, name)
        if has_local_record(path):
            continue
        target = os.path.join(local_folder, f".uncommitted-{s}-{int(time.time())}")
        os.rename(path, target)
        log.warning("local checkpoint step %d was never committed; moved aside to %s", s, target)
        moved.append(target)
    return moved


def restore_checkpoint(store: Store, dest: str, step: int | None = None, progress: ByteProgress | None = None,
                       notify: Callable[[str], None] | None = None, *, wanted: Wanted = WHOLE,
                       agree: Agreement | None = None, infos: list[CheckpointInfo] | None = None) -> RestoreResult:
    """Download a complete checkpoint into ``<dest>/step-N/``, verifying every checksum.

    ``step=None``: the newest complete checkpoint; if it is corrupt, the previous complete
    one, and so on (each fallback is logged and passed to ``notify``). An explicit step that
    is incomplete or corrupt is refused. The folder appears under its final name only once
    every file is verified, together with its commit record (so ``dest`` is itself a
    location that ``list``/``verify`` understand).

    ``wanted``: the whole checkpoint, or what some ranks' DCP load reads (:class:`.fetch_plan.Wanted`):
    on the saving world size from the record's read map; on another, its planner says what they read
    of each candidate, from its ``.metadata`` (fetched first); without one, or a record without a read
    map, the whole checkpoint is fetched. ``agree``: each candidate is published only once every node
    accepts it (:mod:`.agree`); a rejection anywhere is a fallback everywhere. ``infos``: the location's
    listing when the caller has one (:func:`.catalog.list_checkpoints`; None: list it).
    """
    infos = list_checkpoints(store) if infos is None else infos
    dest = os.path.abspath(dest)
    by_step = {i.step: i for i in infos}
    if step is not None:
        info = by_step.get(step)
        if info is None:
            raise StorageError(f"{store.location}: no checkpoint step {step}")
        if not info.complete:
            raise StorageError(f"{info.where}: checkpoint step {step} is incomplete ({info.detail}); refusing to "
                               f"restore it")
        candidates = [step]
    else:
        candidates = sorted((i.step for i in infos if i.complete), reverse=True)
        if not candidates:
            raise StorageError(f"{store.location}: no complete checkpoint to restore")
    skipped: list[tuple[int, str]] = []
    for n, s in enumerate(candidates):
        fetched: _Fetched | None = None
        plan_round = (_PlanRound(agree, s) if agree is not None and wanted.planner is not None
                      and wanted.resharded_to(by_step[s].world_size) is not None else None)
        try:
            fetched = _fetch(store, _plan(store, s, dest, wanted, plan_round), dest, progress)
            why = ""
        except (CorruptCheckpoint, ManifestError) as e:
            why = str(e)
            if plan_round is not None:
                plan_round.vote(why)  # a no, when this node failed before it voted
        except BaseException as e:
            if agree is not None:
                agree.abort(s, str(e) or type(e).__name__)
            raise
        if agree is not None:
            other = agree(s, why)
            if other and not why:
                why = other
        if not why and fetched is not None:
            result = fetched.publish()
            result.skipped = skipped
            return result
        if fetched is not None:
            fetched.discard()
        _set_aside(dest, s)
        if step is not None:
            raise CorruptCheckpoint(why, [])
        skipped.append((s, why))
        if n + 1 < len(candidates):
            msg = f"checkpoint step {s} is corrupt ({why}); falling back to step {candidates[n + 1]}"
        else:
            msg = f"checkpoint step {s} is corrupt ({why}); no older complete checkpoint left"
        log.warning(msg)
        if notify:
            notify(msg)
    raise StorageError(f"{store.location}: every complete checkpoint is corrupt: "
                       + "; ".join(f"step {s}: {why}" for s, why in skipped))


def _clean_leftovers(dest: str) -> None:
    """Remove temporary folders of restores that were killed (their process is gone)."""
    for name in os.listdir(dest):
        if not name.startswith((".restoring-", ".replaced-", ".planning-")):
            continue
        try:
            pid = int(name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            continue  # still running
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(os.path.join(dest, name), ignore_errors=True)


def _set_aside(dest: str, step: int) -> None:
    """A local copy of a step that some node rejected must not be what torchtitan resumes from
    (it picks the highest ``step-N``): rename it to ``.rejected-N-<time>``."""
    final = os.path.join(os.path.abspath(dest), layout.step_dir(step))
    if os.path.isdir(final):
        target = os.path.join(os.path.abspath(dest), f".rejected-{step}-{int(time.time())}")
        os.rename(final, target)
        log.warning("local checkpoint step %d was rejected; moved aside to %s", step, target)


@dataclass
class _Fetched:
    """A verified copy waiting for the nodes' verdict under a name torchtitan does not pick up."""

    result: RestoreResult
    tmp: str | None
    """The temporary folder (None: the final folder already held an intact copy)."""

    def publish(self) -> RestoreResult:
        if self.tmp is not None:
            final = self.result.path
            old = None
            if os.path.lexists(final):
                old = os.path.join(os.path.dirname(final), f".replaced-{self.result.step}-{os.getpid()}")
                os.rename(final, old)
            os.rename(self.tmp, final)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        # No fsync: it would flush the whole checkpoint (0.1-0.6 s per GiB measured); after a
        # crash the local copy is re-verified against its commit record before being reused.
        return self.result

    def discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _plan(store: Store, step: int, dest: str, wanted: Wanted, plan_round: _PlanRound | None) -> FetchPlan:
    """The fetch of candidate ``step`` into ``dest`` of what this node wants."""
    m = read_manifest(store, step)
    share = _wanted_share(store, m, dest, wanted, plan_round)
    final = os.path.join(dest, layout.step_dir(step))
    held = read_share(final, m) if share is not None and os.path.isdir(final) else None
    if (share is not None and held is not None and held.world_size == share.world_size
            and not set(share.ranks) <= set(held.ranks)):
        # a folder shared by several nodes (checkpoint.local on a shared filesystem): another node's
        # ranks may be loading from it: the new copy holds both shares (a share of another world size
        # is of no rank that loads now)
        share = share.joined(held, m)
    return FetchPlan.of(m, share)


def _wanted_share(store: Store, m: Manifest, dest: str, wanted: Wanted,
                  plan_round: _PlanRound | None) -> Share | None:
    where = store.url(layout.commit_path(m.step))
    world_size = wanted.resharded_to(m.world_size)
    if world_size is not None:
        if wanted.planner is not None:
            return _planned_share(store, m, dest, world_size, wanted.planner, plan_round)
        log.info("checkpoint step %d was saved by %d ranks, loaded by %d: fetching all of it", m.step,
                 m.world_size, world_size)
        return None
    ranks = wanted.ranks
    if ranks is None:
        return None
    if callable(ranks):
        try:
            ranks = ranks(m.world_size)
        except ValueError as e:  # not a fault of the checkpoint: no fallback
            raise StorageError(f"{where}: {e}") from None
    share = node_share(m, rank_reads(store, m, ranks), where)
    if share is None:
        log.info("checkpoint step %d has no read map (saved before read maps, or without the checkpointer's "
                 "plan): fetching all of it", m.step)
    return share


def _planned_share(store: Store, m: Manifest, dest: str, world_size: int, planner: NodePlanner,
                   plan_round: _PlanRound | None) -> Share | None:
    """The share of the node's ranks of another world size than the save's: its ``.metadata`` is fetched
    (verified) into a folder torchtitan does not pick up, every node says so (``plan_round``), and the ranks
    work out what their load reads of it."""
    check_present(store, m)
    if not any(f.path == layout.DCP_METADATA for f in m.files):
        raise ManifestError(f"{store.url(layout.commit_path(m.step))}: no {layout.DCP_METADATA} in the record")
    folder = os.path.join(dest, f".planning-{m.step}-{os.getpid()}")  # no "step-N" in it, as for .restoring-
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    try:
        download(store, FetchPlan.of(m, Share([], [layout.DCP_METADATA])), folder, None)  # the .metadata alone
        other = plan_round.vote("") if plan_round is not None else ""
        if other:
            raise CorruptCheckpoint(other, [])
        reads = planner(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if reads is None:
        log.info("checkpoint step %d: the ranks could not tell what their load reads: fetching all of it", m.step)
        return None
    return reads_share(m, reads, world_size, store.url(layout.commit_path(m.step)))


def _fetch(store: Store, plan: FetchPlan, dest: str, progress: ByteProgress | None) -> _Fetched:
    """Execute ``plan`` into ``dest``: a copy of it under a temporary name, or the intact one already there."""
    m, step, share, need = plan.manifest, plan.step, plan.share, plan.nbytes
    final = os.path.join(dest, layout.step_dir(step))
    if os.path.isdir(final) and intact(final, plan):
        log.info("checkpoint step %d is already intact in %s", step, final)
        if progress:
            progress(need, need)
        return _Fetched(RestoreResult(step, final, m.total_bytes, m.world_size, reused=True,
                                      share=read_share(final, m)), None)
    check_present(store, m)
    os.makedirs(dest, exist_ok=True)
    _clean_leftovers(dest)
    free = shutil.disk_usage(dest).free
    if free < need:
        raise StorageError(f"{dest}: not enough free space to restore step {step}: "
                           f"{need / 2**30:.2f} GiB needed, {free / 2**30:.2f} GiB free")
    # temporary names must not contain "step-N": torchtitan picks up any folder matching it
    tmp = os.path.join(dest, f".restoring-{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        gathered = download(store, plan, tmp, ByteCounter(need, progress).add)
        meta = os.path.join(tmp, layout.META_DIR)
        os.makedirs(meta, exist_ok=True)
        with open(os.path.join(tmp, layout.COMMIT_RECORD), "wb") as out:
            out.write(m.local_copy())  # the index alone (format 2), as fetched where it names no attempt folder
        if share is not None:
            with open(os.path.join(meta, SHARE_FILE), "wb") as out:
                out.write(share.to_json())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    parts_txt = "" if share is None else (f" for ranks {_ranks_text(share.ranks)} of {share.world_size}: "
                                          f"{len(share.whole)} file(s) whole, {len(share.blocks)} in part"
                                          + (f", {len(gathered)} small item(s) of {len({p for p, _, _ in gathered})} "
                                             f"file(s) in one GET" if gathered else ""))
    log.info("checkpoint step %d: fetched %d of %d bytes%s", step, need, m.total_bytes, parts_txt)
    return _Fetched(RestoreResult(step, final, m.total_bytes, m.world_size, fetched=need, share=share), tmp)


def _ranks_text(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
