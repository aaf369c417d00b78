"""``slurm-titan ckpt ...``: list, show, restore, verify and prune checkpoints of a location.

LOCATION is a run's remote URL (``s3://bucket/prefix``, any fsspec URL) or path, or a local
checkpoint folder. S3 endpoint and credentials come from the environment (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION) or ``--endpoint-url``.
Each subcommand returns an exit code; storage failures raise StorageError (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from slurm_titan import table
from slurm_titan.cli.base import SubCommand, add_subcommands, run_chosen
from slurm_titan.errors import ExitCode, StorageError

if TYPE_CHECKING:
    from slurm_titan.ckpt import Wanted


def _add_location(parser: argparse.ArgumentParser) -> None:
    """The arguments every ckpt subcommand starts with."""
    parser.add_argument("location", metavar="LOCATION", help="s3://bucket/prefix, another fsspec URL, or a folder")
    parser.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")


def _open(args: argparse.Namespace) -> Any:
    from slurm_titan.ckpt import open_store

    return open_store(args.location, endpoint_url=args.endpoint_url, check=True)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "?"


class ProgressBar:
    """A byte progress bar on stderr (redrawn in place on a terminal, a few lines otherwise)."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label, self.stream, self.enabled = label, stream or sys.stderr, enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self.last = 0.0
        self.last_decile = -1
        self.finished = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if done < total and now - self.last < 0.1:
                return
            self.last = now
            frac = done / total if total else 1.0
            width = 30
            fill = int(width * frac)
            rate = done / max(now - self.start, 1e-6) / 2**20
            self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% "
                              f"{human_bytes(done)}/{human_bytes(total)} {rate:.0f} MiB/s ")
            self.stream.flush()
        else:
            decile = int(10 * done / total) if total else 10
            if decile != self.last_decile:
                self.last_decile = decile
                self.stream.write(f"{self.label}: {decile * 10}% of {human_bytes(total)}\n")

    def close(self) -> None:
        if self.enabled and self.tty and not self.finished:
            self.stream.write("\n")
            self.stream.flush()
        self.finished = True


class ListCheckpoints(SubCommand):
    name = "list"
    help = "checkpoints of a location, oldest first"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_location(parser)
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.ckpt import list_checkpoints

        store = _open(args)
        infos = list_checkpoints(store)
        if args.json:
            print(json.dumps({"location": store.location, "checkpoints": [i.to_dict() for i in infos]}, indent=1))
            return 0
        if not infos:
            print(f"no checkpoints at {store.location}")
            return 0
        print(table.render(("STEP", "STATUS", "TIME (UTC)", "SIZE", "FILES", "WORLD", "WHERE"), [
            (str(i.step), i.status, _when(i.time), human_bytes(i.size), "?" if i.files is None else str(i.files),
             "?" if i.world_size is None else str(i.world_size),
             i.where + (f"  ({i.detail})" if i.detail and not i.complete else "")) for i in infos]))
        return 0


class Show(SubCommand):
    name = "show"
    help = "the commit record of one checkpoint"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_location(parser)
        parser.add_argument("step", metavar="STEP", type=int)
        parser.add_argument("--json", action="store_true", help="print the commit record as JSON")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.ckpt import layout, read_manifest

        store = _open(args)
        m = read_manifest(store, args.step)
        if args.json:
            sys.stdout.write(json.dumps(m.view(_read_maps(store, m)), indent=1) + "\n")
            return 0
        print(f"step:          {m.step}")
        print(f"where:         {store.url(layout.step_dir(m.step))}")
        print(f"files in:      {store.url(m.key('')) if m.data_dir else '(the step folder)'}")
        print(f"world size:    {m.world_size}")
        print(f"saved at:      {m.saved_at}")
        print(f"committed at:  {m.committed_at}")
        print(f"config digest: {m.config_digest or '-'}")
        print(f"attempt:       {m.attempt or '-'}")
        print(f"size:          {human_bytes(m.total_bytes)} in {len(m.files)} file(s), {m.algorithm} checksums")
        for f in sorted(m.files, key=lambda f: f.path):
            print(f"  {f.size:>14}  {f.checksum}  {f.path}")
        return 0


def _read_maps(store: Any, m: Any) -> list | None:
    """Every rank's read map of a record (None, said on stderr, when its parts are not all there: a node's
    restored copy holds the index alone)."""
    from slurm_titan.ckpt import all_reads

    try:
        return all_reads(store, m)
    except StorageError as e:
        print(f"slurm-titan: warning: no read maps shown: {e}", file=sys.stderr)
        return None


def _wanted(args: argparse.Namespace) -> Wanted:
    """What ``ckpt restore`` fetches: the share of ``--ranks`` or ``--node K --nodes N``, or the whole checkpoint."""
    from slurm_titan.ckpt import Wanted, node_ranks

    if args.ranks is not None and (args.node is not None or args.nodes is not None):
        raise StorageError("ckpt restore: give --ranks or --node/--nodes, not both")
    if args.ranks is not None:
        try:
            return Wanted(sorted({int(r) for r in args.ranks.split(",")}))
        except ValueError:
            raise StorageError(f"ckpt restore: --ranks {args.ranks!r}: expected ranks like 0,1,2") from None
    if (args.node is None) != (args.nodes is None):
        raise StorageError("ckpt restore: --node K needs --nodes N (and --nodes N needs --node K)")
    if args.node is None:
        return Wanted()
    try:
        node_ranks(args.node, args.nodes, args.nodes)  # K in [0, N): refused before contacting the store
    except ValueError as e:
        raise StorageError(f"ckpt restore: {e}") from None
    return Wanted(lambda world_size: node_ranks(args.node, args.nodes, world_size))


class Restore(SubCommand):
    name = "restore"
    help = "download a complete checkpoint, verifying checksums"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_location(parser)
        parser.add_argument("--step", type=int, help="the step (default: newest complete; falls back if corrupt)")
        parser.add_argument("--to", required=True, metavar="DIR", help="destination folder (gets DIR/step-N/)")
        parser.add_argument("--ranks", metavar="R[,R...]", help="only what these ranks' load reads (one node's "
                            "share; the whole checkpoint when its commit record has no read map)")
        parser.add_argument("--node", type=int, metavar="K", help="with --nodes: the share of node K's ranks")
        parser.add_argument("--nodes", type=int, metavar="N", help="the node count the checkpoint's ranks split over")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.ckpt import restore_checkpoint

        wanted = _wanted(args)
        store = _open(args)
        bar = ProgressBar("restore", enabled=not args.quiet)

        def notify(msg: str) -> None:
            bar.close()
            print(f"slurm-titan: warning: {msg}", file=sys.stderr)
            bar.finished = False
            bar.start = time.monotonic()

        try:
            result = restore_checkpoint(store, args.to, step=args.step, progress=bar, notify=notify, wanted=wanted)
        finally:
            bar.close()
        how = "already intact in" if result.reused else "restored to"
        share = "" if result.share is None else (f" (the share of ranks {','.join(map(str, result.share.ranks))}: "
                                                 f"{human_bytes(result.fetched)} fetched)")
        print(f"checkpoint step {result.step} ({human_bytes(result.bytes)}) {how} {result.path}{share}")
        return 0


class Verify(SubCommand):
    name = "verify"
    help = "recompute every checksum of a checkpoint"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_location(parser)
        parser.add_argument("--step", type=int, help="the step (default: the newest complete)")
        parser.add_argument("--all", action="store_true", help="verify every complete checkpoint")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.ckpt import list_checkpoints, verify

        store = _open(args)
        if args.all:
            steps = [i.step for i in list_checkpoints(store) if i.complete]
            if not steps:
                raise StorageError(f"{store.location}: no complete checkpoint")
        else:
            steps = [args.step]
        status = 0
        for s in steps:
            bar = ProgressBar(f"verify{'' if s is None else f' step {s}'}", enabled=not args.quiet)
            try:
                report = verify(store, s, progress=bar)
            finally:
                bar.close()
            if report.ok:
                share = "" if report.share is None else f" (the share of ranks {','.join(map(str, report.share))})"
                print(f"step {report.step}: OK, {report.files} file(s), {human_bytes(report.bytes)} at {report.where}"
                      f"{share}")
            else:
                status = ExitCode.BAD_CHECKPOINT
                print(f"step {report.step}: {len(report.bad)} BAD file(s) at {report.where}:")
                for path, why in report.bad:
                    print(f"  {path}: {why}")
        return status


class Prune(SubCommand):
    name = "prune"
    help = ("delete old checkpoints (keeps the newest complete one always), and what attempts that did not commit "
            "a kept one left in it")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_location(parser)
        parser.add_argument("--keep", type=int, required=True, metavar="K", help="keep the last K complete checkpoints")
        parser.add_argument("--keep-every", type=int, default=0, metavar="M",
                            help="also keep every complete checkpoint whose step is a multiple of M")
        parser.add_argument("--grace", type=float, default=900.0, metavar="SECONDS",
                            help="leave incomplete checkpoints written less than this long ago (default 900)")
        parser.add_argument("--dry-run", action="store_true", help="only say what would be deleted")

    def run(self, args: argparse.Namespace) -> int:
        from slurm_titan.ckpt import prune

        if args.keep < 1:
            raise StorageError("--keep must be at least 1")
        if args.keep_every < 0:
            raise StorageError("--keep-every must be >= 0")
        store = _open(args)
        plan = prune(store, args.keep, args.keep_every, dry_run=args.dry_run, grace=args.grace, sweep=True)
        verb = "would delete" if args.dry_run else "deleted"
        for s in plan.delete:
            print(f"{verb} step {s}: {plan.reasons[s]}")
        for s in plan.keep:
            print(f"kept step {s}: {plan.reasons[s]}")
        for s, folders in plan.swept.items():
            print(f"{'would remove' if args.dry_run else 'removed'} from step {s}: {', '.join(folders)} (attempts "
                  "that did not commit it)")
        if not plan.delete and not plan.swept:
            print(f"nothing to delete at {store.location}")
        return 0


class Ckpt(SubCommand):
    name = "ckpt"
    help = "list, show, verify, restore and prune checkpoints"
    description = ("List, show, verify, restore and prune the checkpoints of a location: a run's remote URL "
                   "(s3://bucket/prefix, any fsspec URL) or path, or a local checkpoint folder. S3 endpoint and "
                   "credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
                   "--endpoint-url.")
    commands: ClassVar[tuple[SubCommand, ...]] = (ListCheckpoints(), Show(), Restore(), Verify(), Prune())

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_subcommands(parser, self.commands, dest="ckpt_command")

    def run(self, args: argparse.Namespace) -> int:
        return run_chosen(self.commands, args.ckpt_command, args)
