"""``slurm-titan data prepare``: text (JSON lines) -> token shards and their manifest, in parallel, resumable
(torch-free: the tokenizing function is handed in by the command, see :mod:`slurm_titan.overrides.shard_tokenizer`),
and ``slurm-titan data index``: the manifest of Megatron shards made elsewhere.

The documents are the inputs' lines in order (files in the order given, a folder's ``*.jsonl``/``*.json``
sorted by name), so document ``n`` of the shards is row ``n`` of the same JSON lines read by the resharding
loader. Each file is cut into shards of ``documents_per_shard`` lines (:func:`plan_shards`: one pass that
records where each shard starts); every shard is tokenised by a worker process and appears whole or not at
all (:class:`.megatron_index.ShardWriter`). A rerun with the same inputs and tokenizer keeps the shards that
are there and makes the missing ones; the manifest is written last. ``upload`` then copies the shards to a
store with the checkpoint uploads' block checksums, and writes the manifest there last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from slurm_titan.data.megatron_index import bin_path, idx_path, open_bin, read_index, token_dtype
from slurm_titan.data.token_manifest import MANIFEST_FILE, Manifest, ShardInfo, TokenizerInfo
from slurm_titan.data.token_names import ShardError

STATE_FILE = ".prepare.json"
"""What an output folder is being prepared from: a rerun must match it."""
SHARD_NAME = "shard-{:05d}"
ALGORITHM = "xxh3_128"
"""The checksum of uploaded shards and their blocks (the checkpoint uploads')."""


@dataclass(frozen=True, kw_only=True)
class ShardJob:
    """One shard to make: ``documents`` lines of ``source`` from byte ``offset``, into ``prefix``.bin/.idx."""

    source: str
    offset: int
    documents: int
    prefix: str
    tokenizer: str
    dtype: str
    field: str


ShardMaker = Callable[[ShardJob], None]
"""Tokenises and writes one shard (run in a worker process: a module-level function)."""


def input_files(inputs: list[str]) -> list[Path]:
    """The JSON-lines files of ``inputs`` (files, or folders of ``*.jsonl``/``*.json``), in reading order."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.suffix in (".jsonl", ".json") and p.is_file())
            if not found:
                raise ShardError(f"{item}: no *.jsonl or *.json files in the folder")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise ShardError(f"{item}: no such file or folder")
    return files


def _shard_starts(path: Path, per_shard: int) -> Iterator[tuple[int, int]]:
    """(byte offset, lines) of each run of ``per_shard`` lines of ``path`` (blank lines are no documents)."""
    start, lines, offset = 0, 0, 0
    with path.open("rb") as text:
        for line in text:
            if line.strip():
                if lines == per_shard:
                    yield start, lines
                    start, lines = offset, 0
                lines += 1
            offset += len(line)
    if lines:
        yield start, lines


def plan_shards(files: list[Path], output: Path, per_shard: int, tokenizer: str, dtype: str,
                field: str) -> list[ShardJob]:
    """Every shard of the inputs, numbered through them in order."""
    jobs: list[ShardJob] = []
    for path in files:
        for offset, documents in _shard_starts(path, per_shard):
            jobs.append(ShardJob(source=str(path.absolute()), offset=offset, documents=documents,
                                 prefix=str(output / SHARD_NAME.format(len(jobs))), tokenizer=tokenizer, dtype=dtype,
                                 field=field))
    return jobs


def read_documents(job: ShardJob) -> Iterator[str]:
    """The texts of a shard's lines (each a JSON object with ``job.field``)."""
    with open(job.source, "rb") as text:
        text.seek(job.offset)
        read = 0
        for number, line in enumerate(text):
            if read == job.documents:
                return
            if not line.strip():
                continue
            try:
                value = json.loads(line)[job.field]
            except (ValueError, KeyError, TypeError):
                raise ShardError(f"{job.source}: line {number + 1} after byte {job.offset} is not a JSON object "
                                 f"with a {job.field!r} field") from None
            if not isinstance(value, str):
                raise ShardError(f"{job.source}: line {number + 1} after byte {job.offset}: its {job.field!r} is "
                                 f"{type(value).__name__}, not text")
            read += 1
            yield value


def describe_shard(prefix: str | Path) -> ShardInfo:
    """What the manifest says of a made shard, read back from its files."""
    index = read_index(idx_path(prefix))
    tokens = open_bin(bin_path(prefix), index)
    return ShardInfo(name=Path(prefix).name, documents=index.documents, tokens=index.tokens,
                     max_token=int(tokens.max()) if len(tokens) else -1,
                     bin_size=os.path.getsize(bin_path(prefix)), idx_size=os.path.getsize(idx_path(prefix)))


def _made(job: ShardJob) -> ShardInfo:
    info = describe_shard(job.prefix)
    if info.documents != job.documents:
        raise ShardError(f"{idx_path(job.prefix)}: {info.documents} documents, its input has {job.documents} "
                         "there: the inputs changed since it was made; prepare into an empty folder")
    return info


def _check_state(output: Path, state: dict[str, object]) -> None:
    """``output`` is empty, or was being prepared from the same inputs with the same tokenizer."""
    path = output / STATE_FILE
    if path.exists():
        before = json.loads(path.read_text())
        if before != state:
            changed = sorted(key for key in state if before.get(key) != state[key])
            raise ShardError(f"{output}: being prepared with other settings ({', '.join(changed)} differ); "
                             "prepare into an empty folder")
    elif any(output.iterdir()):
        raise ShardError(f"{output}: not empty and not a folder that `slurm-titan data prepare` was preparing")
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=1) + "\n")


@dataclass(frozen=True, kw_only=True)
class Prepared:
    manifest: Manifest
    made: int
    """Shards made by this run (the others were there)."""


def prepare(inputs: list[str], output: Path, *, tokenizer_dir: str, tokenizer: TokenizerInfo, make_shard: ShardMaker,
            documents_per_shard: int, workers: int, field: str = "text",
            progress: Callable[[int, int], None] | None = None) -> Prepared:
    """Tokenise ``inputs`` into shards under ``output`` and write its manifest (see the module docstring)."""
    files = input_files(inputs)
    dtype = np.dtype(token_dtype(tokenizer.vocab_size)).name
    output.mkdir(parents=True, exist_ok=True)
    _check_state(output, {"inputs": [str(p.absolute()) for p in files], "tokenizer": tokenizer.digest,
                          "documents_per_shard": documents_per_shard, "field": field, "dtype": dtype})
    jobs = plan_shards(files, output, documents_per_shard, tokenizer_dir, dtype, field)
    missing = [job for job in jobs if not idx_path(job.prefix).exists()]
    if missing:
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(missing)))) as pool:
            for done, _ in enumerate(pool.map(make_shard, missing), 1):
                if progress:
                    progress(done, len(missing))
    manifest = Manifest(tokenizer=tokenizer, dtype=dtype, shards=tuple(_made(job) for job in jobs),
                        source={"inputs": [str(p.absolute()) for p in files], "field": field})
    _write_manifest(output, manifest)
    return Prepared(manifest=manifest, made=len(missing))


def index_folder(folder: Path, tokenizer: TokenizerInfo) -> Manifest:
    """The manifest of Megatron shards made elsewhere (every ``*.idx`` of ``folder`` with its ``.bin``, in name
    order), written into ``folder``: the tokenizer is the caller's word; the shards' token ids are checked against
    its vocabulary when a job starts."""
    prefixes = sorted(p.with_suffix("") for p in folder.glob("*.idx") if not p.name.startswith("."))
    if not prefixes:
        raise ShardError(f"{folder}: no Megatron shards (*.idx with their .bin) in the folder")
    shards = tuple(describe_shard(prefix) for prefix in prefixes)
    dtypes = {read_index(idx_path(prefix)).dtype.name for prefix in prefixes}
    if len(dtypes) > 1:
        raise ShardError(f"{folder}: shards of several token dtypes ({', '.join(sorted(dtypes))}): one dataset has one")
    manifest = Manifest(tokenizer=tokenizer, dtype=dtypes.pop(), shards=shards, source={"indexed": str(folder)})
    _write_manifest(folder, manifest)
    return manifest


def _write_manifest(output: Path, manifest: Manifest) -> None:
    tmp = output / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, output / MANIFEST_FILE)


def upload(output: Path, manifest: Manifest, location: str, *, endpoint_url: str | None = None) -> Manifest:
    """Copy the shards of ``output`` to the store at ``location`` (block checksums recorded), then its manifest."""
    from slurm_titan.ckpt import open_store

    store = open_store(location, endpoint_url=endpoint_url, check=True, create=True)
    rels = [rel for shard in manifest.shards for rel in (shard.bin, shard.idx)]
    entries = store.upload_many([(str(output / rel), rel) for rel in rels], algorithm=ALGORITHM)
    uploaded = replace(manifest, checksum_algorithm=ALGORITHM, files={e.path: e.to_dict() for e in entries})
    store.put_bytes(MANIFEST_FILE, uploaded.to_json().encode())
    return uploaded

