"""The manifest of a token-shard dataset (``manifest.json`` beside its shards; torch-free).

``slurm-titan data prepare`` writes it last, once every shard is whole; the job reads it first and refuses,
in one line, a manifest made with another tokenizer (:func:`tokenizer_digest`: the vocabulary and the BOS/EOS
ids) or one whose largest token id the job's vocabulary cannot hold. Each shard is a Megatron ``.bin`` +
``.idx`` pair (:mod:`.megatron_index`) with one document per sequence; shards are read in the manifest's
order, their documents numbered on from the previous shard's. Uploaded shards also carry each file's block
checksums (``files``), which the S3 reader verifies every fetched range against.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_titan.data import identity
from slurm_titan.data.token_names import TOKEN_SHARDS_DATASET, ShardError

FORMAT = "slurm-titan-token-shards/1"
MANIFEST_FILE = "manifest.json"
KIND = "token-shards"
"""The dataset kind in the data position's fingerprint (:mod:`.identity`)."""


def tokenizer_digest(vocab: Mapping[str, int], bos_id: int | None, eos_id: int | None) -> str:
    """What makes two tokenizers give the same ids: the vocabulary (token -> id) and the BOS/EOS ids."""
    text = json.dumps({"vocab": sorted(vocab.items(), key=lambda item: item[1]), "bos": bos_id, "eos": eos_id},
                      ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    digest: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerInfo:
        """A torchtitan ``HuggingFaceTokenizer``'s (or any with ``get_vocab``, ``get_vocab_size``, BOS/EOS ids)."""
        bos, eos = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
        return cls(digest=tokenizer_digest(tokenizer.get_vocab(), bos, eos), vocab_size=tokenizer.get_vocab_size(),
                   bos_id=bos, eos_id=eos)


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard: files ``<name>.bin`` and ``<name>.idx``, its documents, tokens and largest token id."""

    name: str
    documents: int
    tokens: int
    max_token: int
    bin_size: int
    idx_size: int

    @property
    def bin(self) -> str:
        return f"{self.name}.bin"

    @property
    def idx(self) -> str:
        return f"{self.name}.idx"


@dataclass(frozen=True, kw_only=True)
class Manifest:
    tokenizer: TokenizerInfo
    dtype: str
    shards: tuple[ShardInfo, ...]
    source: dict[str, Any] = field(default_factory=dict)
    """What the shards were made from (path, documents), for people."""
    checksum_algorithm: str | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per uploaded file: the store's record of it (size, checksum, block_size, blocks)."""

    @property
    def documents(self) -> int:
        return sum(shard.documents for shard in self.shards)

    @property
    def tokens(self) -> int:
        return sum(shard.tokens for shard in self.shards)

    def to_json(self) -> str:
        body: dict[str, Any] = {"format": FORMAT, "tokenizer": vars(self.tokenizer).copy(), "dtype": self.dtype,
                                "documents": self.documents, "tokens": self.tokens,
                                "shards": [vars(shard).copy() for shard in self.shards], "source": self.source}
        if self.checksum_algorithm:
            body |= {"checksum_algorithm": self.checksum_algorithm, "files": self.files}
        return json.dumps(body, indent=1) + "\n"

    def content_digest(self) -> str:
        """A digest of what the data position indexes: the shards in order with their sizes, and the tokenizer."""
        text = json.dumps([self.tokenizer.digest, self.dtype, [vars(shard) for shard in self.shards]],
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def fingerprint(self, location: str) -> dict[str, Any]:
        """The data position's fingerprint (:func:`.identity.difference` compares it)."""
        size = sum(shard.bin_size + shard.idx_size for shard in self.shards)
        return identity.content_fingerprint(TOKEN_SHARDS_DATASET, location, KIND, self.documents, size,
                                            self.content_digest())

    def check_tokenizer(self, current: TokenizerInfo, where: str) -> None:
        """The job's tokenizer is the one the shards were made with, and its vocabulary holds every token id."""
        made = self.tokenizer
        if made.digest != current.digest:
            raise ShardError(f"{where}: the shards were made with another tokenizer (vocabulary {made.vocab_size}, "
                             f"BOS {made.bos_id}, EOS {made.eos_id}, {made.digest[:19]}) than the job's "
                             f"(vocabulary {current.vocab_size}, BOS {current.bos_id}, EOS {current.eos_id}, "
                             f"{current.digest[:19]}); prepare them again with the job's tokenizer")
        for shard in self.shards:
            if shard.max_token >= current.vocab_size:
                raise ShardError(f"{where}: shard {shard.name} holds token id {shard.max_token}, outside the job's "
                                 f"vocabulary of {current.vocab_size}")


def _field(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ShardError(f"{where}: {key!r} is missing or not {getattr(kind, '__name__', kind)}: {value!r}")
    return value


def _shard(raw: Any, where: str) -> ShardInfo:
    if not isinstance(raw, dict):
        raise ShardError(f"{where}: a shard entry is not an object")
    name = _field(raw, "name", str, where)
    if not name or name.startswith(("/", ".")) or ".." in name.split("/") or "\\" in name:
        raise ShardError(f"{where}: refusing shard name {name!r} (a relative path inside the dataset)")
    values = {key: _field(raw, key, int, f"{where}: shard {name}")
              for key in ("documents", "tokens", "max_token", "bin_size", "idx_size")}
    return ShardInfo(name=name, **values)


def parse_manifest(text: bytes | str, where: str) -> Manifest:
    """The manifest in ``text`` (the file ``where``), checked for shape; ShardError naming ``where`` if not."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise ShardError(f"{where}: not JSON ({error})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ShardError(f"{where}: not a token-shard manifest of format {FORMAT} (format {found!r})")
    tok = _field(raw, "tokenizer", dict, where)
    tokenizer = TokenizerInfo(digest=_field(tok, "digest", str, where),
                              vocab_size=_field(tok, "vocab_size", int, where),
                              bos_id=tok.get("bos_id"), eos_id=tok.get("eos_id"))
    shards = tuple(_shard(item, where) for item in _field(raw, "shards", list, where))
    names = [shard.name for shard in shards]
    if len(set(names)) != len(names):
        raise ShardError(f"{where}: shard names repeat")
    return Manifest(tokenizer=tokenizer, dtype=_field(raw, "dtype", str, where), shards=shards,
                    source=raw.get("source") or {}, checksum_algorithm=raw.get("checksum_algorithm"),
                    files=raw.get("files") or {})
