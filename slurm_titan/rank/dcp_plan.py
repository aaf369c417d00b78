"""A rank's DCP load of a checkpoint as byte ranges of its files, by DCP's own planner (imports torch).

``dcp.load(state_dict)`` turns each Stateful into its state dict, runs
``DefaultLoadPlanner.set_up_planner(state_dict, metadata)`` and ``create_local_plan()``, and
FileSystemReader then reads, for each ReadItem, the bytes ``metadata.storage_data[item.storage_index]``
names (``relative_path``, ``offset``, ``length``: a whole saved chunk, narrowed in memory)
(torch/distributed/checkpoint/state_dict_loader.py, default_planner.py, filesystem.py
``read_data``). :func:`load_reads` runs the same calls without reading anything. Run on the
saving rank right after its save, with the state dict it saved and the metadata DCP returned,
it says which ranges that rank's load on the same world size reads: the read map of the
commit record (:mod:`.share`). On another world size the loading ranks run it at restore time, on the
state dict they will load and the candidate's metadata (:func:`folder_reads`, asked by the node's
restore through rank.restore_gate).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, Metadata
from torch.distributed.checkpoint.stateful import Stateful

from slurm_titan.ckpt import Range, is_data, layout, merged


def load_reads(state_dict: dict[str, Any], metadata: Metadata) -> list[Range]:
    """The byte ranges (file, offset, length) that ``dcp.load(state_dict)`` of a checkpoint with
    ``metadata`` reads on this rank, merged."""
    stateful = {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in sorted(state_dict.items())}
    planner = DefaultLoadPlanner()
    planner.set_up_planner(stateful, metadata, is_coordinator=False)
    plan = planner.create_local_plan()
    out = []
    for item in plan.items:
        info = metadata.storage_data[item.storage_index]
        out.append((info.relative_path, int(info.offset), int(info.length)))
    return merged(out)


def folder_reads(state_dict: dict[str, Any], folder: str) -> list[Range]:
    """:func:`load_reads` of the checkpoint whose ``.metadata`` is in ``folder``."""
    return load_reads(state_dict, FileSystemReader(folder).read_metadata())


def small_items(metadata: Metadata, rank: int, limit: int) -> dict[str, list[tuple[int, int]]]:
    """Per file this rank wrote (``__R_*.distcp``): the (offset, length) of its items shorter than
    ``limit`` bytes. DCP writes a file's bytes items first and its tensors largest first
    (FileSystemWriter ``_split_by_size_and_type``), so the items other ranks read of it (the
    replicated ones: train state, AdamW's step counters) lie at its head and tail; given their own
    checksums at upload, they are fetched exactly instead of as whole blocks."""
    out: dict[str, list[tuple[int, int]]] = {}
    for info in metadata.storage_data.values():
        if info.length < limit and layout.file_owner(info.relative_path) == rank and is_data(info.relative_path):
            out.setdefault(info.relative_path, []).append((int(info.offset), int(info.length)))
    return {p: sorted(v) for p, v in out.items()}


def check_share(checkpoint_dir: str, state_dict: dict[str, Any]) -> None:
    """Before ``dcp.load(state_dict, checkpoint_id=checkpoint_dir)``: when the folder holds one
    node's share of the checkpoint (``.slurm-titan/share.json``), check that every byte range this
    rank's load reads is in it (fetched and verified). Raises StorageError (one line: folder, file,
    range) otherwise, so that a hole of a sparse file is never loaded as zeros."""
    import os

    from slurm_titan.ckpt import SHARE_FILE, Manifest, Share
    from slurm_titan.errors import StorageError

    meta = os.path.join(checkpoint_dir, layout.META_DIR)
    try:
        with open(os.path.join(meta, SHARE_FILE), "rb") as f:
            share = Share.from_json(f.read(), checkpoint_dir)
    except FileNotFoundError:
        return  # the whole checkpoint is here
    with open(os.path.join(checkpoint_dir, layout.COMMIT_RECORD), "rb") as f:
        m = Manifest.from_json(f.read(), where=checkpoint_dir)
    reads = folder_reads(state_dict, checkpoint_dir)
    of = f" of world size {share.world_size}" if share.world_size else ""
    for path, off, length in reads:
        known = any(f.path == path for f in m.files)
        if not known or not share.covers(m, path, off, length):
            raise StorageError(
                f"{checkpoint_dir}: this rank's load reads bytes {off}-{off + length} of {path}, "
                + ("a file missing from the commit record" if not known else
                   f"which this node did not fetch (it holds the share of ranks {share.ranks}{of})")
                + ": refusing to load")
