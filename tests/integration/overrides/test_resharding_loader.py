"""The resharding data loader on real torch / datasets (CPU, no process group): data-parallel degrees are
simulated by building one loader per rank. Every sample's text carries its id and length; the test
tokenizer turns token j of sample i into i * 1000 + j, so what the loader yielded says which sample
and which token of it each position is."""

from __future__ import annotations

import json
import pickle
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan")

from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # noqa: E402

from slurm_titan.data.cursor import DataResumeError  # noqa: E402
from slurm_titan.overrides.resharding_loader import ReshardingDataLoader, resharding_dataloader  # noqa: E402

SEQ, BATCH = 16, 2


class IdTokenizer:
    """'<id> <length>' -> [id * 1000 + j for j < length] (BOS and EOS are its first and last token)."""

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        ident, length = map(int, text.split())
        return [ident * 1000 + j for j in range(length)]


def write_samples(folder: Path, count: int, seed: int = 0) -> dict[int, int]:
    """JSON lines whose text names the sample's id and token count; returns id -> token count."""
    rng = random.Random(seed)
    lengths = {i: rng.choice([2, 3, 5, 9, 14, 30, 47]) for i in range(count)}
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "train.jsonl").open("w") as out:
        for i, n in lengths.items():
            out.write(json.dumps({"text": f"{i} {n}"}) + "\n")
    return lengths


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    folder = tmp_path_factory.mktemp("ids")
    return folder, write_samples(folder, 240)


def loader(folder: Path, degree: int, rank: int, cls: type = ReshardingDataLoader, **config) -> object:
    cfg = cls.Config(dataset="c4_test", dataset_path=str(folder), infinite=config.pop("infinite", False), **config)
    return cls(cfg, dp_world_size=degree, dp_rank=rank, tokenizer=IdTokenizer(), seq_len=SEQ, local_batch_size=BATCH)


def batches(it, steps: int | None) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    out = []
    for batch in it:
        out.append(batch)
        if steps is not None and len(out) == steps:
            break
    return out


def tokens(got: list) -> list[tuple[int, int]]:
    """(sample id, token index) of every input position yielded."""
    return [divmod(int(t), 1000) for inputs, _ in got for t in inputs["input"].flatten()]


def checkpoint(loaders: list) -> dict:
    """What DCP would save: the entry every rank's state_dict() makes from all ranks' parts."""
    state = loaders[0].global_state([(ld.dp_rank, ld.local_state()) for ld in loaders])
    return {key: pickle.loads(pickle.dumps(value)) for key, value in state.items()}


def resumed(folder: Path, state: dict, degree: int, **config) -> list:
    fresh = [loader(folder, degree, r, **config) for r in range(degree)]
    for ld in fresh:
        ld.load_state_dict(state)
    return fresh


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0]["input"], y[0]["input"]) and
                                    torch.equal(x[0]["positions"], y[0]["positions"]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b))


def test_unchanged_degree_yields_exactly_torchtitans_batches_before_and_after_resume(data) -> None:
    folder, _ = data
    for rank in range(2):
        ours, theirs = loader(folder, 2, rank), loader(folder, 2, rank, HuggingFaceTextDataLoader)
        mine, titan = iter(ours), iter(theirs)
        assert same(batches(mine, 7), batches(titan, 7))
        pair = [ours if r == rank else loader(folder, 2, r) for r in range(2)]
        state, titan_state = checkpoint(pair), theirs.state_dict()
        again = resumed(folder, state, 2)[rank]
        titan_again = loader(folder, 2, rank, HuggingFaceTextDataLoader)
        titan_again.load_state_dict(titan_state)
        assert same(batches(iter(again), None), batches(iter(titan_again), None))


def test_unchanged_degree_resume_equals_the_uninterrupted_run_across_epochs(data) -> None:
    folder, _ = data
    whole = batches(iter(loader(folder, 2, 1, infinite=True)), 80)  # the shard's ~30 batches: epochs 0, 1, 2
    for cut in (1, 33, 61):
        first = [loader(folder, 2, r, infinite=True) for r in range(2)]
        head = batches(iter(first[1]), cut)
        rest = batches(iter(resumed(folder, checkpoint(first), 2, infinite=True)[1]), 80 - cut)
        assert same(head + rest, whole)


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 4), (4, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("steps", [1, 3, 6])
def test_reshard_reads_every_unconsumed_token_exactly_once(data, old: int, new: int, steps: int) -> None:
    folder, lengths = data
    first = [loader(folder, old, r) for r in range(old)]
    seen = [t for ld in first for t in tokens(batches(iter(ld), steps))]
    after = resumed(folder, checkpoint(first), new)
    seen += [t for ld in after for t in tokens(batches(iter(ld), None))]
    counts = Counter(seen)
    assert max(counts.values()) == 1  # nothing consumed twice, at token level
    expected = {(i, j) for i, n in lengths.items() for j in range(n - 1)}
    missing = expected - set(counts)
    assert set(counts) <= expected
    # finite data: each rank drops the tail of its buffer (< seq_len tokens) when its plan ends, as torchtitan
    assert len(missing) < new * SEQ
    assert all((i, j + 1) in missing for i, j in missing if j + 1 < lengths[i] - 1)  # only sample ends


def test_a_sample_cut_by_the_checkpoint_goes_on_at_its_token_offset(data) -> None:
    folder, lengths = data
    first = [loader(folder, 2, r) for r in range(2)]
    for ld in first:
        batches(iter(ld), 2)
    cursors = [pickle.loads(ld.local_state()) for ld in first]
    cut = [c for c in cursors if c["offset"]]
    assert cut, "the data set is built so that the checkpoint cuts a sample"
    after = resumed(folder, checkpoint(first), 1)[0]
    got = batches(iter(after), 1)
    ident, token = divmod(int(got[0][0]["input"][0, 0]), 1000)
    assert token == cursors[0]["offset"] if cursors[0]["offset"] else token == 0
    assert int(got[0][0]["positions"][0, 0]) == 0  # torchtitan's per-chunk normalisation, as uninterrupted


def test_state_has_one_key_for_every_degree_and_names_the_dataset(data) -> None:
    folder, _ = data
    for degree in (1, 3):
        state = checkpoint([loader(folder, degree, r) for r in range(degree)])
        assert list(state) == ["world_size"]
        saved = pickle.loads(state["world_size"])
        assert saved["dp_world_size"] == degree and len(saved["ranks"]) == degree
        assert saved["dataset"]["rows"] == 240 and saved["dataset"]["kind"] == "map-style"


def test_missing_rank_in_the_gathered_state_is_an_error(data) -> None:
    folder, _ = data
    two = [loader(folder, 2, r) for r in range(2)]
    with pytest.raises(RuntimeError, match=r"got data-parallel ranks \[1\], expected 0..1"):
        two[0].global_state([(1, two[1].local_state())])


def test_old_loader_checkpoint_is_refused_in_one_line(data) -> None:
    folder, _ = data
    titan = loader(folder, 2, 0, HuggingFaceTextDataLoader)
    ours = loader(folder, 2, 0)
    with pytest.raises(DataResumeError, match="torchtitan's own loader") as refused:
        ours.load_state_dict(titan.state_dict())
    assert "\n" not in str(refused.value) and "restart_data" in str(refused.value)


def test_other_dataset_is_refused_unless_allowed(data, tmp_path: Path) -> None:
    folder, _ = data
    write_samples(tmp_path / "other", 240, seed=1)
    state = checkpoint([loader(folder, 1, 0)])
    with pytest.raises(DataResumeError, match="another dataset") as refused:
        loader(tmp_path / "other", 1, 0).load_state_dict(state)
    assert "\n" not in str(refused.value) and "allow_dataset_change" in str(refused.value)
    allowed = loader(tmp_path / "other", 1, 0, allow_dataset_change=True)
    allowed.load_state_dict(state)
    assert batches(iter(allowed), 1)


def test_same_content_at_another_path_resumes(data, tmp_path: Path) -> None:
    folder, _ = data
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "train.jsonl").write_bytes((folder / "train.jsonl").read_bytes())
    first = loader(folder, 1, 0)
    head = batches(iter(first), 3)
    after = resumed(moved, checkpoint([first]), 1)[0]
    assert same(head + batches(iter(after), None), batches(iter(loader(folder, 1, 0)), None))


def test_dataset_shorter_than_the_cursor_is_refused(data, tmp_path: Path) -> None:
    folder, _ = data
    short = tmp_path / "short"
    short.mkdir()
    (short / "train.jsonl").write_text("".join((folder / "train.jsonl").read_text().splitlines(True)[:100]))
    state = checkpoint([loader(folder, 2, r) for r in range(2)])
    with pytest.raises(DataResumeError, match="has 100 rows but the checkpoint's data position needs 240"):
        loader(short, 1, 0, allow_dataset_change=True).load_state_dict(state)


def test_workers_are_refused(data) -> None:
    folder, _ = data
    with pytest.raises(DataResumeError, match="num_workers=2"):
        loader(folder, 1, 0, num_workers=2)


def test_override_swaps_only_the_loader_class() -> None:
    cfg = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path="/x", infinite=False)
    swapped = resharding_dataloader(cfg, allow_dataset_change=True)
    assert type(swapped) is ReshardingDataLoader.Config
    assert (swapped.dataset, swapped.dataset_path, swapped.infinite, swapped.allow_dataset_change) == (
        "c4_test", "/x", False, True)
