"""Generate the tiny tokenizer and dataset that the debug configs train on (no model or dataset hub).

The text is a deterministic pseudo-language: documents of sentences drawn from a fixed
vocabulary with a seeded RNG, so every machine builds byte-identical files and two runs of
the same job see the same tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DATASET_FILE = "train.jsonl"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zu", "pe", "da", "gi", "ho", "ba", "fe")


def _words(rng: random.Random, count: int) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(count)]


def _documents(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = _words(rng, 400)
    docs = []
    for _ in range(count):
        sentences = []
        for _ in range(rng.randint(2, 12)):
            body = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(4, 14)))
            sentences.append(body.capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def write_dataset(folder: Path, documents: int = 4000, seed: int = 0) -> Path:
    """Write `documents` JSON lines (`{"text": ...}`) to folder/train.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / DATASET_FILE
    with path.open("w", encoding="utf-8") as out:
        for text in _documents(seed, documents):
            out.write(json.dumps({"text": text}) + "\n")
    return path


def write_tokenizer(folder: Path, vocab_size: int = 2000, seed: int = 0) -> Path:
    """Train a byte-level BPE tokenizer on the generated text and save it in Hugging Face form."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_documents(seed + 1, 2000), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def ensure_assets(root: Path) -> tuple[Path, Path]:
    """Create root/tokenizer and root/dataset unless already there; return both folders."""
    tokenizer_dir, dataset_dir = root / "tokenizer", root / "dataset"
    _ensure(tokenizer_dir, TOKENIZER_FILES, write_tokenizer)
    _ensure(dataset_dir, (DATASET_FILE,), write_dataset)
    return tokenizer_dir, dataset_dir


def _ensure(folder: Path, files: tuple[str, ...], write: Callable[[Path], Path]) -> None:
    """`folder` holding `files`, else written by write() into a fresh folder beside it and renamed into place, so
    that jobs submitted at once never read a half-written file; an incomplete folder (its writer killed) is
    replaced, a complete one that another writer renamed first is kept."""
    if all((folder / name).is_file() for name in files):
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    write(fresh)
    if folder.exists() and not all((folder / name).is_file() for name in files):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        fresh.rename(folder)
    except OSError:  # another writer's complete folder is in place
        shutil.rmtree(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder that receives tokenizer/ and dataset/")
    args = parser.parse_args(argv)
    tokenizer_dir, dataset_dir = ensure_assets(args.root)
    print(f"tokenizer: {tokenizer_dir}\ndataset: {dataset_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
