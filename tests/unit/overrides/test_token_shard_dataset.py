"""The token-shard loader's packing and position, in one process with fake rank numbers (no process group), on
shards whose token j of document i is i * 1000 + j: what was yielded says which document and token each
position is."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from slurm_titan.data.token_manifest import TokenizerInfo, tokenizer_digest  # noqa: E402
from slurm_titan.overrides.token_shard_loader import TokenShardDataLoader  # noqa: E402
from tests.integration.overrides.test_resharding_loader import batches, checkpoint, same, tokens  # noqa: E402
from tests.support.token_shards import write_shards  # noqa: E402

SEQ, BATCH = 16, 2
TOKENIZER = TokenizerInfo(digest=tokenizer_digest({}, None, None), vocab_size=1 << 20, bos_id=None, eos_id=None)


class NoVocabTokenizer:
    """The tokenizer interface the loader reads (its identity); it never encodes."""

    bos_id = eos_id = None

    def get_vocab(self) -> dict[str, int]:
        return {}

    def get_vocab_size(self) -> int:
        return TOKENIZER.vocab_size


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    """240 documents of 2..47 tokens in 3 shards."""
    rng = random.Random(0)
    lengths = {i: rng.choice([2, 3, 5, 9, 14, 30, 47]) for i in range(240)}
    docs = [[i * 1000 + j for j in range(n)] for i, n in lengths.items()]
    folder = tmp_path_factory.mktemp("ids")
    write_shards(folder, [docs[:100], docs[100:130], docs[130:]], TOKENIZER)
    return folder, lengths


def loader(folder: Path, degree: int, rank: int, **config) -> TokenShardDataLoader:
    cfg = TokenShardDataLoader.Config(dataset="token_shards", dataset_path=str(folder),
                                      infinite=config.pop("infinite", False), **config)
    return TokenShardDataLoader(cfg, dp_world_size=degree, dp_rank=rank, tokenizer=NoVocabTokenizer(), seq_len=SEQ,
                                local_batch_size=BATCH)


def resumed(folder: Path, state: dict, degree: int, **config) -> list[TokenShardDataLoader]:
    fresh = [loader(folder, degree, r, **config) for r in range(degree)]
    for ld in fresh:
        ld.load_state_dict(state)
    return fresh


def test_packing_keeps_document_boundaries(data) -> None:
    folder, lengths = data
    got = batches(iter(loader(folder, 1, 0)), None)
    assert got
    for inputs, labels in got:
        for row, label_row, positions in zip(inputs["input"].tolist(), labels.tolist(), inputs["positions"].tolist()):
            for k, (token, label, position) in enumerate(zip(row, label_row, positions)):
                assert label == token + 1  # the next token of the same document: no label crosses a boundary
                starts = k == 0 or row[k - 1] // 1000 != token // 1000
                assert (position == 0) == starts and (starts or position == positions[k - 1] + 1)
    # every document's inputs (all its tokens but the last), in order, none split but at sequence ends
    seen = tokens(got)
    assert seen == sorted(seen) and all(j < lengths[i] - 1 for i, j in seen)


def test_batches_carry_the_document_tables_of_the_npu_attention(data) -> None:
    folder, _ = data
    inputs, _ = next(iter(loader(folder, 1, 0)))
    assert inputs.offsets[-1] == BATCH * SEQ and len(inputs.offsets) > BATCH


def test_same_degree_resume_is_bit_identical_across_epochs(data) -> None:
    folder, _ = data
    whole = batches(iter(loader(folder, 2, 1, infinite=True)), 80)  # the share's ~30 batches: epochs 0, 1, 2
    for cut in (1, 33, 61):
        first = [loader(folder, 2, r, infinite=True) for r in range(2)]
        head = batches(iter(first[1]), cut)
        rest = batches(iter(resumed(folder, checkpoint(first), 2, infinite=True)[1]), 80 - cut)
        assert same(head + rest, whole)


def test_epochs_after_the_first_are_reshuffled_by_the_seed(data) -> None:
    folder, _ = data
    epochs = {seed: tokens(batches(iter(loader(folder, 1, 0, infinite=True, seed=seed)), 250)) for seed in (42, 7)}
    epoch0 = len(tokens(batches(iter(loader(folder, 1, 0)), None)))
    assert epochs[42][:epoch0] == epochs[7][:epoch0]
    assert epochs[42][epoch0:] != epochs[7][epoch0:]
    assert epochs[42] == tokens(batches(iter(loader(folder, 1, 0, infinite=True, seed=42)), 250))


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("steps", [1, 3, 6])
def test_reshard_reads_every_unconsumed_token_exactly_once(data, old: int, new: int, steps: int) -> None:
    folder, lengths = data
    first = [loader(folder, old, r) for r in range(old)]
    seen = [t for ld in first for t in tokens(batches(iter(ld), steps))]
    after = resumed(folder, checkpoint(first), new)
    seen += [t for ld in after for t in tokens(batches(iter(ld), None))]
    counts = Counter(seen)
    assert max(counts.values()) == 1
    expected = {(i, j) for i, n in lengths.items() for j in range(n - 1)}
    missing = expected - set(counts)
    assert set(counts) <= expected
    assert len(missing) < new * SEQ  # finite data: each rank drops its last partial sequence, as torchtitan
    assert all((i, j + 1) in missing for i, j in missing if j + 1 < lengths[i] - 1)  # only the stream's tail


def test_a_shard_checkpoint_loads_only_where_the_shards_are_the_same(data, tmp_path: Path) -> None:
    folder, _ = data
    state = checkpoint([loader(folder, 1, 0)])
    write_shards(tmp_path / "other", [[[5, 6, 7]] * 240], TOKENIZER)
    with pytest.raises(Exception, match="another dataset") as refused:
        loader(tmp_path / "other", 1, 0).load_state_dict(state)
    assert "\n" not in str(refused.value)


def test_no_dataset_path_and_workers_are_refused(data) -> None:
    folder, _ = data
    with pytest.raises(Exception, match="dataloader.dataset_path names: none is set"):
        loader("", 1, 0)
    with pytest.raises(Exception, match="num_workers=2"):
        loader(folder, 1, 0, num_workers=2)
