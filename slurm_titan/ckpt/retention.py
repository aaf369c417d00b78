"""Which checkpoints of a tier to keep, and pruning the rest.

Rules (:func:`plan_retention`):

- keep the newest ``keep_last`` complete checkpoints (0: all of them), and every complete
  checkpoint whose step is a multiple of ``keep_every`` (0: none) forever;
- never delete the newest complete checkpoint;
- incomplete checkpoints never count toward ``keep_last``;
- incomplete checkpoints older than the newest complete one are deleted; newer ones are
  left alone (an upload may still be running);
- never delete a ``protected`` step (one an upload in this process is working on), nor an
  incomplete checkpoint touched less than ``grace`` seconds ago.

Each checkpoint goes by :func:`.commit.delete_checkpoint` (catalog entry, commit record, files:
an interrupted deletion leaves an incomplete checkpoint, never a "complete" one with holes).

With ``sweep``, the complete checkpoints kept lose what attempts other than the committing one left in them
(:func:`stale_folders`: a failed attempt's receipts, a cut-off node's data that landed late): nothing reads those,
restore and verify go through the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import CheckpointInfo, list_checkpoints, read_manifest
from slurm_titan.ckpt.commit import delete_checkpoint
from slurm_titan.ckpt.storage import Store

log = logging.getLogger("slurm_titan.ckpt.retention")


@dataclass
class PrunePlan:
    keep: list[int] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    """Why each step is kept or deleted."""
    swept: dict[int, list[str]] = field(default_factory=dict)
    """Of the complete steps kept (with ``sweep``): the folders of attempts that did not commit them, removed."""


def plan_retention(infos: list[CheckpointInfo], keep_last: int, keep_every: int = 0,
                   protected: Iterable[int] = (), grace: float = 0.0, now: float | None = None) -> PrunePlan:
    if keep_last < 0 or keep_every < 0:
        raise ValueError("keep_last and keep_every must be >= 0")
    now = time.time() if now is None else now
    protected = set(protected)
    complete = sorted(i.step for i in infos if i.complete)
    newest = complete[-1] if complete else None
    plan = PrunePlan()
    last = set(complete[-keep_last:]) if keep_last > 0 else set(complete)
    for info in sorted(infos, key=lambda i: i.step):
        s = info.step
        if s in protected:
            why, keep = "in use by an upload in progress", True
        elif info.complete:
            if s == newest:
                why, keep = "newest complete", True
            elif s in last:
                why, keep = f"among the last {keep_last} complete" if keep_last else "keep all complete", True
            elif keep_every and s % keep_every == 0:
                why, keep = f"step is a multiple of {keep_every}", True
            else:
                why, keep = "older than the last complete ones kept", False
        else:
            if newest is None or s > newest:
                why, keep = "incomplete, newer than the newest complete (may be uploading)", True
            elif info.time is not None and now - info.time < grace:
                why, keep = f"incomplete but written less than {grace:.0f} s ago", True
            else:
                why, keep = "incomplete and older than the newest complete", False
        (plan.keep if keep else plan.delete).append(s)
        plan.reasons[s] = why
    return plan


def stale_folders(store: Store, step: int) -> list[str]:
    """The attempt folders of committed step ``step`` (data and receipts) that its commit record does not name."""
    named = read_manifest(store, step).data_dir
    return [e.path for folder in (layout.step_dir(step), layout.receipt_dir(step, "")) for e in store.ls(folder)
            if e.is_dir and e.name != named and e.name and layout.is_attempt_dir(e.name)]


def prune(store: Store, keep_last: int, keep_every: int = 0, *, dry_run: bool = False,
          protected: Iterable[int] = (), grace: float = 0.0,
          infos: list[CheckpointInfo] | None = None, sweep: bool = False) -> PrunePlan:
    """Apply :func:`plan_retention` to a location (nothing is deleted with ``dry_run``); with ``sweep``, find (and
    remove) the :func:`stale_folders` of the complete steps kept too."""
    infos = list_checkpoints(store) if infos is None else infos
    plan = plan_retention(infos, keep_last, keep_every, protected, grace)
    by_step = {i.step: i for i in infos}
    if sweep:
        plan.swept = {s: found for s in plan.keep if by_step[s].complete and (found := stale_folders(store, s))}
    if dry_run:
        return plan
    for s in plan.delete:
        log.info("deleting checkpoint step %d at %s (%s)", s, by_step[s].where, plan.reasons[s])
        delete_checkpoint(store, by_step[s])
    for s, folders in plan.swept.items():
        log.info("removing from step %d what attempts that did not commit it left: %s", s, ", ".join(folders))
        for folder in folders:
            store.rm_tree(folder)
    return plan
