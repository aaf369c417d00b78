"""Before (re)starting training on a node: put the newest complete checkpoint on local disk.

Run once per node (not per rank) by the node launcher, before torchtitan starts::

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
import time

from slurm_titan.ckpt import layout
from slurm_titan.ckpt.catalog import Agreement, ByteProgress, RestoreResult, list_checkpoints, newest_complete, restore
from slurm_titan.ckpt.storage import open_store

log = logging.getLogger("slurm_titan.ckpt.resume")


def prepare_resume(remote: str, local_folder: str, step: int | None = None, *,
                   endpoint_url: str | None = None, storage_options: dict | None = None,
                   progress: ByteProgress | None = None, ranks: list[int] | None = None,
                   world_size: int | None = None, agree: Agreement | None = None) -> RestoreResult | None:
    """Restore ``step`` (default: the newest complete checkpoint, falling back past corrupt ones)
    of ``remote`` into ``local_folder/step-N`` and hide newer uncommitted local steps. ``ranks``,
    ``world_size``, ``agree``: see :func:`.catalog.restore` (one node's share; one verdict for all).

    Returns what was restored (step, world size, ...), or None when the remote holds no complete
    checkpoint (a fresh start; local uncommitted steps are then hidden too). Raises StorageError
    (one line) if the remote is unreachable."""
    store = open_store(remote, endpoint_url=endpoint_url, storage_options=storage_options, check=True, create=True)
    result: RestoreResult | None = None
    if step is not None or newest_complete(list_checkpoints(store)) is not None:
        result = restore(store, local_folder, step=step, progress=progress,
                         notify=lambda msg: log.warning("%s", msg), ranks=ranks, world_size=world_size, agree=agree)
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
        if os.path.exists(os.path.join(path, layout.META_DIR, "commit.json")):
            continue
        target = os.path.join(local_folder, f".uncommitted-{s}-{int(time.time())}")
        os.rename(path, target)
        log.warning("local checkpoint step %d was never committed; moved aside to %s", s, target)
        moved.append(target)
    return moved
