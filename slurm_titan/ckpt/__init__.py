"""Checkpoint storage for slurm-titan: upload, commit, list, verify, restore, retention.

torchtitan writes each checkpoint as DCP shards into ``<local>/step-N/`` on fast node-local
disk; every rank uploads its own files to the run's remote location in the background and
rank 0 writes the commit record last, create-only. A checkpoint is *complete* only when its
commit record exists (:mod:`.commit` states the protocol and what a crash leaves behind).

The package, top to bottom:

- :mod:`.layout`     names of things inside a checkpoint location
- :mod:`.checksum`   file checksums (xxh3_128, or sha256 without xxhash)
- :mod:`.manifest`   the commit record (its index) and the per-rank receipt (JSON, path-checked)
- :mod:`.parts`      each rank's part of the record: its read map, named by the index
- :mod:`.share`      a node's share of a checkpoint (the blocks its ranks' load reads, worked out
                     in each rank by :mod:`slurm_titan.rank.dcp_plan`)
- :mod:`.storage`    open a location (URL or path) as a Store: one interface, one module per
                     backend (local folder, any fsspec, S3 and its fast http.client path), with
                     checksummed bulk upload/download and ranged O_DIRECT restores
- :mod:`.catalog`    list / show / verify
- :mod:`.commit`     THE COMMIT PROTOCOL: receipts -> sizes -> commit record -> catalog entry;
                     the delete order
- :mod:`.retention`  which checkpoints to keep, and pruning
- :mod:`.lease`      one writer per location: the writer lease, create-only generations
- :mod:`.upload`     per-rank background upload + rank 0's committer thread; the Uploader Protocol
- :mod:`.upload_process`  a rank's CheckpointSync in a child process (outside training's GIL): the
                     parent's side; :mod:`.upload_child_main` is the child's ``python -m`` entry
- :mod:`.agree`      one verdict on a restored checkpoint for all nodes of a job
- :mod:`.fetch_plan` what a restore fetches: what a node wants, and each candidate's plan
- :mod:`.fetch`      the fetcher: a plan fetched into a folder and verified; a local copy checked
- :mod:`.restore`    restore a complete checkpoint; before a (re)start, onto a node's local disk

The ``slurm-titan ckpt ...`` CLI is :mod:`slurm_titan.cli.ckpt`; the torchtitan hook that
feeds the uploader is :mod:`slurm_titan.rank.checkpointer`.

The public surface is what this module exports (``__all__``) and :mod:`.layout` (the names inside a
location); other packages import nothing else from ckpt (the ``ckpt-api`` contract in pyproject.toml).
"""

from slurm_titan.ckpt.agree import NodeAgreement
from slurm_titan.ckpt.catalog import (
    CheckpointInfo,
    VerifyReport,
    list_checkpoints,
    newest_complete,
    read_manifest,
    verify,
)
from slurm_titan.ckpt.commit import delete_checkpoint, is_committed
from slurm_titan.ckpt.fetch import CorruptCheckpoint
from slurm_titan.ckpt.fetch_plan import NodePlanner, Wanted
from slurm_titan.ckpt.lease import RENEW_S as LEASE_RENEW_S
from slurm_titan.ckpt.lease import Holder, Lease, LeaseLost, LeaseRefused
from slurm_titan.ckpt.lease import read as read_lease
from slurm_titan.ckpt.lease import renew as renew_lease
from slurm_titan.ckpt.lease import take as take_lease
from slurm_titan.ckpt.lease import verdict as lease_verdict
from slurm_titan.ckpt.manifest import FileEntry, Manifest, Range, Receipt
from slurm_titan.ckpt.parts import all_reads
from slurm_titan.ckpt.restore import RestoreResult, hide_uncommitted, prepare_resume, restore_checkpoint
from slurm_titan.ckpt.retention import PrunePlan, plan_retention, prune
from slurm_titan.ckpt.share import SHARE_FILE, Share, is_data, merged, node_ranks
from slurm_titan.ckpt.storage import Store, TransferConfig, open_store
from slurm_titan.ckpt.upload import CheckpointSync, Uploader
from slurm_titan.ckpt.upload_process import UploaderProcess, UploadSettings

__all__ = [
    "LEASE_RENEW_S",
    "SHARE_FILE",
    "CheckpointInfo",
    "CheckpointSync",
    "CorruptCheckpoint",
    "FileEntry",
    "Holder",
    "Lease",
    "LeaseLost",
    "LeaseRefused",
    "Manifest",
    "NodeAgreement",
    "NodePlanner",
    "PrunePlan",
    "Range",
    "Receipt",
    "RestoreResult",
    "Share",
    "Store",
    "TransferConfig",
    "UploadSettings",
    "Uploader",
    "UploaderProcess",
    "VerifyReport",
    "Wanted",
    "all_reads",
    "delete_checkpoint",
    "hide_uncommitted",
    "is_committed",
    "is_data",
    "lease_verdict",
    "list_checkpoints",
    "merged",
    "newest_complete",
    "node_ranks",
    "open_store",
    "plan_retention",
    "prepare_resume",
    "prune",
    "read_lease",
    "read_manifest",
    "renew_lease",
    "restore_checkpoint",
    "take_lease",
    "verify",
]
