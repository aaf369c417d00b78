"""``slurm-titan data prepare``: tokenize a text dataset once, offline, into token shards that jobs train from;
``slurm-titan data index``: the manifest of Megatron shards made elsewhere.

The work is :mod:`slurm_titan.data.prepare` (torch-free); the tokenizer is torchtitan's, the one the job
uses (:mod:`slurm_titan.overrides.shard_tokenizer`), imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from slurm_titan.cli.base import SubCommand, add_subcommands, run_chosen

if TYPE_CHECKING:
    from slurm_titan.data.token_manifest import Manifest

DOCUMENTS_PER_SHARD = 100_000


class Prepare(SubCommand):
    name = "prepare"
    help = "tokenize JSON lines into Megatron .bin/.idx token shards with a manifest (parallel, resumable)"
    description = ("Tokenize JSON lines (files, or folders of *.jsonl / *.json) with the job's tokenizer into "
                   "Megatron .bin/.idx shards and a manifest.json under OUTPUT. A rerun with the same inputs and "
                   "tokenizer makes only the shards that are missing. --upload copies the shards to a store "
                   "(s3://bucket/prefix; AWS_ENDPOINT_URL and the AWS keys, or --endpoint-url) with block "
                   "checksums, the manifest last. A job reads them with dataloader.dataset: token_shards and "
                   "dataloader.dataset_path: OUTPUT (or the --upload location).")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("inputs", nargs="+", metavar="INPUT", help="JSON-lines file or folder")
        parser.add_argument("--tokenizer", required=True, metavar="DIR",
                            help="the job's tokenizer folder (hf_assets_path: tokenizer.json, tokenizer_config.json)")
        parser.add_argument("--output", required=True, type=Path, metavar="OUTPUT", help="folder of the shards")
        parser.add_argument("--field", default="text", help="the JSON field holding each document's text")
        parser.add_argument("--documents-per-shard", type=int, default=DOCUMENTS_PER_SHARD, metavar="N")
        parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes")
        parser.add_argument("--upload", metavar="LOCATION", help="also copy the shards to this store location")
        parser.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.data import prepare
        from slurm_titan.overrides import shard_tokenizer

        if args.documents_per_shard < 1 or args.workers < 1:
            print("slurm-titan: --documents-per-shard and --workers must be >= 1", file=sys.stderr)
            return 2
        done = prepare.prepare(args.inputs, args.output, tokenizer_dir=args.tokenizer,
                               tokenizer=shard_tokenizer.describe(args.tokenizer),
                               make_shard=shard_tokenizer.make_shard, documents_per_shard=args.documents_per_shard,
                               workers=args.workers, field=args.field)
        _report(args.output, done.manifest, done.made)
        if args.upload:
            _upload(args, args.output, done.manifest)
        return 0


class Index(SubCommand):
    name = "index"
    help = "write the manifest of Megatron .bin/.idx shards made elsewhere (e.g. by Megatron's preprocess_data.py)"
    description = ("Write FOLDER/manifest.json for the Megatron shards (*.idx with their .bin) in FOLDER, in name "
                   "order, checking each pair; --tokenizer is the tokenizer they were made with (the job's), whose "
                   "digest the job checks at start. --upload copies shards and manifest to a store as prepare does.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("folder", type=Path, metavar="FOLDER", help="folder of the shards")
        parser.add_argument("--tokenizer", required=True, metavar="DIR", help="the tokenizer the shards were made with")
        parser.add_argument("--upload", metavar="LOCATION", help="also copy the shards to this store location")
        parser.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.data import prepare
        from slurm_titan.overrides import shard_tokenizer

        manifest = prepare.index_folder(args.folder, shard_tokenizer.describe(args.tokenizer))
        _report(args.folder, manifest, None)
        if args.upload:
            _upload(args, args.folder, manifest)
        return 0


def _report(folder: Path, manifest: Manifest, made: int | None) -> None:
    now = f" ({made} made now)" if made is not None else ""
    print(f"{folder}: {len(manifest.shards)} shards{now}, {manifest.documents} documents, {manifest.tokens} tokens "
          f"of {manifest.dtype}")


def _upload(args: argparse.Namespace, folder: Path, manifest: Manifest) -> None:
    from slurm_titan.data import prepare

    prepare.upload(folder, manifest, args.upload, endpoint_url=args.endpoint_url)
    print(f"{args.upload}: uploaded {len(manifest.shards)} shards and the manifest")


class Data(SubCommand):
    name = "data"
    help = "prepare token shards for training"
    commands: ClassVar[tuple[SubCommand, ...]] = (Prepare(), Index())

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_subcommands(parser, self.commands, dest="data_command")

    def run(self, args: argparse.Namespace) -> int:
        return run_chosen(self.commands, args.data_command, args)
