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
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
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
    ``limit`` bytes that every rank loads: non-tensor items and tensors saved as one chunk (replicated
    ones: train state, AdamW's step counters; DCP's dedup spreads them over the ranks' files). DCP writes a
    file's bytes items first and its tensors largest first (FileSystemWriter ``_split_by_size_and_type``),
    so they lie at its head and tail; given their own checksums at upload, they are fetched exactly instead
    of as whole blocks. A shard of a sharded tensor, read on the saving world size by its own rank only,
    gets none (at 4,096 ranks every item of a 70B shard is small: checksums for all of them made the
    commit record O(ranks x items))."""
    out: dict[str, list[tuple[int, int]]] = {}
    for index, info in metadata.storage_data.items():
        if (info.length < limit and layout.file_owner(info.relative_path) == rank and is_data(info.relative_path)
                and _whole(metadata.state_dict_metadata.get(index.fqn))):
            out.setdefault(info.relative_path, []).append((int(info.offset), int(info.length)))
    return {p: sorted(v) for p, v in out.items()}


def _whole(item: object) -> bool:
    """Whether a state dict entry's metadata is of a non-tensor or of a tensor saved as one chunk."""
    return not isinstance(item, TensorStorageMetadata) or len(item.chunks) == 1


def check_share(checkpoint_dir: str, state_dict: dict[str, Any]) -> None:
    """Before ``dcp.load(state_dict, checkpoint_id=checkpoint_dir)``: when the folder holds one
    node's share of the checkpoint (``.slurm-titan/share.json``), check that every byte range this
    rank's load reads is in it (fetched and verified). Raises StorageError (one line: folder, file,
    range) otherwise, so that a hole of a sparse file is never loaded as zeros. The share says all
    that is needed; the commit record is parsed only for a share record written before it did, or to
    tell a read of a file the record lacks from one of a file not fetched."""
    import os

    from slurm_titan.ckpt import SHARE_FILE, Manifest, Share
    from slurm_titan.errors import StorageError

    meta = os.path.join(checkpoint_dir, layout.META_DIR)
    try:
        with open(os.path.join(meta, SHARE_FILE), "rb") as f:
            share = Share.from_json(f.read(), checkpoint_dir)
    except FileNotFoundError:
        return  # the whole checkpoint is here

    def record() -> Manifest:
        with open(os.path.join(checkpoint_dir, layout.COMMIT_RECORD), "rb") as f:
            return Manifest.from_json(f.read(), where=checkpoint_dir)

    if not share.files and (share.blocks or share.spans):
        share = share.with_files(record())
    reads = folder_reads(state_dict, checkpoint_dir)
    of = f" of world size {share.world_size}" if share.world_size else ""
    for path, off, length in reads:
        if share.covers(path, off, length):
            continue
        known = any(f.path == path for f in record().files)
        raise StorageError(
            f"{checkpoint_dir}: this rank's load reads bytes {off}-{off + length} of {path}, "
            + ("a file missing from the commit record" if not known else
               f"which this node did not fetch (it holds the share of ranks {share.ranks}{of})")
            + ": refusing to load")
