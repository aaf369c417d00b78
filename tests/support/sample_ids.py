"""Samples that carry their id, and which of them a run's data loader yielded, read back from the tokens (issue 15).

`write_dataset` writes the debug dataset's documents, each one's text led by its id (`00042 Baba sa ...`):
the debug tokenizer has a token per digit, so a sample's first tokens (BOS and the id's digits) name it.
tests/loader_record.py records, per rank, the input tokens of every batch the data loader yielded (the tensor
training consumes); `Samples.runs` reads such a stream back as the samples it holds: which sample each run of
tokens is, and from which of its tokens on. `check_resumed` asserts what a run resumed on another data-parallel
degree must have consumed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_titan.data.cursor import shard_bounds

ID_DIGITS = 5
ROWS = 1000
"""Samples of the tests' dataset: 4 ranks x 9 steps of the debug config read ~340 of them."""
RECORD_DIR = "data-record"
"""The folder of the job's run folder that tests/loader_record.py writes to."""

Run = tuple[int, int, int]
"""(sample id, first token, end token) of what a stream holds of one sample (its input tokens)."""
Entry = tuple[int, int]
"""(sample id, token it starts at) of a rank's reading order."""


def write_dataset(folder: Path, count: int = ROWS) -> Path:
    """`count` debug documents as JSON lines (the layout of the debug dataset), each text led by its id."""
    from slurm_titan.launch.debug_assets import DATASET_FILE, _documents

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / DATASET_FILE).open("w", encoding="utf-8") as out:
        for ident, text in enumerate(_documents(0, count)):
            out.write(json.dumps({"text": f"{ident:0{ID_DIGITS}d} {text}"}) + "\n")
    return folder


def recorded(job_dir: Path) -> dict[int, list[int]]:
    """The input tokens every data-parallel rank yielded, in order (its replicas must have yielded the same)."""
    streams: dict[int, list[int]] = {}
    for path in sorted((job_dir / RECORD_DIR).glob("dp*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len({line["attempt"] for line in lines}) == 1, f"{path}: batches of several attempts"
        stream = [token for line in lines for sequence in line["input"] for token in sequence]
        rank = lines[0]["dp_rank"]
        assert streams.setdefault(rank, stream) == stream, f"{path}: replicas of data-parallel rank {rank} differ"
    assert sorted(streams) == list(range(len(streams))), f"records of data-parallel ranks {sorted(streams)}"
    return streams


@dataclass
class Samples:
    """The dataset's samples as the loader packs them: each one's input tokens (BOS .. the token before EOS)."""

    inputs: list[tuple[int, ...]]
    bos: int
    _at: dict[tuple[int, ...], list[Entry]] = field(init=False, repr=False)

    GRAM = 1 + ID_DIGITS + 1
    """Tokens that name a sample's start (BOS, the id's digits, one more); a run is looked up by its first ones."""

    def __post_init__(self) -> None:
        self._at = {}
        for ident, tokens in enumerate(self.inputs):
            for start in range(len(tokens)):
                self._at.setdefault(tokens[start:start + self.GRAM], []).append((ident, start))
        heads = {tokens[:1 + ID_DIGITS] for tokens in self.inputs}
        assert len(heads) == len(self.inputs), "the samples' first tokens do not name them"

    @classmethod
    def load(cls, dataset: Path, tokenizer: Path) -> Samples:
        """Tokenised as the rank's loader does (torchtitan's tokenizer, BOS and EOS added)."""
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        from slurm_titan.launch.debug_assets import DATASET_FILE

        tok = HuggingFaceTokenizer(tokenizer_path=str(tokenizer))
        texts = [json.loads(line)["text"] for line in (dataset / DATASET_FILE).read_text().splitlines()]
        return cls([tuple(tok.encode(text, add_bos=True, add_eos=True)[:-1]) for text in texts], tok.bos_id)

    def _matches(self, stream: Sequence[int], at: int) -> list[Entry]:
        """Every (sample, token) whose input tokens from there on are the stream's from `at` on (to the end of
        the sample or of the stream, whichever comes first)."""
        rest = tuple(stream[at:at + self.GRAM])
        if len(rest) == self.GRAM:  # the sample's next GRAM tokens, or all it has left (fewer)
            candidates = [entry for n in range(1, self.GRAM + 1) for entry in self._at.get(rest[:n], ())]
        else:  # the stream ends within GRAM tokens: any sample going on as it does
            candidates = [entry for key, entries in self._at.items() if key[:len(rest)] == rest[:len(key)]
                          for entry in entries]
        return [(ident, start) for ident, start in candidates
                if tuple(stream[at:at + len(self.inputs[ident]) - start])
                == self.inputs[ident][start:][:len(stream) - at]]

    def runs(self, stream: Sequence[int], order: Sequence[Entry]) -> list[Run]:
        """The samples `stream` holds, in order, each found from its own tokens: the one whose tokens, from
        the point where the previous one ended, are the stream's. `order` (the rank's reading order) only
        picks among samples whose remaining tokens are alike (a short rest such as a final `.`)."""
        out: list[Run] = []
        at = 0
        while at < len(stream):
            found = self._matches(stream, at)
            due = order[len(out)] if len(out) < len(order) else None
            if len(found) > 1 and due in found:
                found = [due]
            assert len(found) == 1, (f"stream tokens {at}.. ({list(stream[at:at + 8])}...) are "
                                     f"{'no sample from any token on' if not found else f'any of samples {found[:5]}'}")
            ident, start = found[0]
            end = min(len(self.inputs[ident]), start + len(stream) - at)
            out.append((ident, start, end))
            at += end - start
        return out

    def rest(self, order: Sequence[Entry], runs: Sequence[Run]) -> list[Entry]:
        """What of `order` is left after `runs` (a prefix of it): a sample they cut goes on at its token."""
        if runs and runs[-1][2] < len(self.inputs[runs[-1][0]]):
            ident, _, end = runs[-1]
            return [(ident, end), *order[len(runs):]]
        return list(order[len(runs):])


def _check_prefix(name: str, runs: Sequence[Run], order: Sequence[Entry]) -> None:
    got = [(ident, start) for ident, start, _ in runs]
    for place, (had, due) in enumerate(zip(got, order)):
        ahead = {ident for ident, _ in order[place:]}
        why = ("samples before it are missing" if had[0] in ahead
               else "not one left to it: consumed before, or another rank's")
        assert had == due, (f"{name}: sample {place} yielded is (id, token) {had}, its reading order's is {due}: {why} "
                            f"(it yielded {got[:place + 1]}..., order {list(order[:place + 2])}...)")
    assert len(got) <= len(order), f"{name}: yielded {len(got)} samples, its reading order has {len(order)}"


ORDINALS = ("first", "second", "third", "fourth", "fifth")


def check_resumed(samples: Samples, first: dict[int, list[int]], *later: dict[int, list[int]]) -> list[Run]:
    """What the issue asks of a run whose every later job resumed the job before's last checkpoint on another
    data-parallel degree, read from what each rank yielded (`recorded`; each job but the last ends at that
    checkpoint): no sample's token is consumed twice (a cut sample's rest is the same sample going on at its
    token offset), and none is missing up to the last consumed one. Both hold when what each rank yielded is a
    prefix of its reading order, each sample from the token the order says, which is what is asserted. The
    reading orders: in the first job each rank's contiguous shard of the dataset; in each later one each new
    rank's contiguous part of the job before's ranks' rests in their rank order (slurm_titan.data.cursor).
    Returns every run consumed."""
    rows = len(samples.inputs)
    orders = [[(row, 0) for row in range(*shard_bounds(rows, len(first), rank))] for rank in range(len(first))]
    consumed: list[list[Run]] = []
    every: list[Run] = []
    for index, streams in enumerate((first, *later)):
        if index:
            left = [entry for order, runs in zip(orders, consumed) for entry in samples.rest(order, runs)]
            orders = [left[slice(*shard_bounds(len(left), len(streams), rank))] for rank in range(len(streams))]
        consumed = [samples.runs(streams[rank], orders[rank]) for rank in range(len(streams))]
        for rank in range(len(streams)):
            _check_prefix(f"{ORDINALS[index]} job, data-parallel rank {rank} of {len(streams)}", consumed[rank],
                          orders[rank])
        every += [run for runs in consumed for run in runs]
    return every
