"""Token shards of given documents for tests, with a manifest for a made-up tokenizer (no tokenizer needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from slurm_titan.data.megatron_index import ShardWriter
from slurm_titan.data.prepare import SHARD_NAME, describe_shard
from slurm_titan.data.token_manifest import MANIFEST_FILE, Manifest, TokenizerInfo

TOKENIZER = TokenizerInfo(digest="sha256:test", vocab_size=1 << 20, bos_id=None, eos_id=None)


def write_shards(folder: Path, shards: Sequence[Sequence[Sequence[int]]], tokenizer: TokenizerInfo = TOKENIZER,
                 dtype: type[np.number] = np.int32) -> Manifest:
    """One shard per item of ``shards`` (its documents' token ids), and the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    infos = []
    for number, documents in enumerate(shards):
        prefix = folder / SHARD_NAME.format(number)
        with ShardWriter(prefix, dtype) as shard:
            for document in documents:
                shard.add_document(document)
        infos.append(describe_shard(prefix))
    manifest = Manifest(tokenizer=tokenizer, dtype=np.dtype(dtype).name, shards=tuple(infos))
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
    return manifest
