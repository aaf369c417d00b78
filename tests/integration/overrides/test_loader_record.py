"""tests/support/loader_record.py and tests/support/sample_ids.py in one process (CPU, no process group; data-parallel
degrees simulated by one loader per rank): the data loader that torchtitan builds from a config with the plan's
resharding override and the recording one records exactly what it yields, and `check_resumed` reads a resumed
run's samples back from those records, accepts the resharded continuation and catches a replay or a gap.
The dataset, tokenizer, degrees and steps are tests/e2e/test_reshard.py's (6 steps on one degree, 3 more on
another), so this is what that test's jobs yield on the cluster, batch for batch."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan.config import apply_overrides  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402

from slurm_titan.launch.debug_assets import write_tokenizer  # noqa: E402
from slurm_titan.overrides import RESHARDING_DATALOADER  # noqa: E402
from slurm_titan.overrides.resharding_loader import ReshardingDataLoader  # noqa: E402
from tests.support.configs import LOCAL_BATCH, SEQ_LEN  # noqa: E402
from tests.support.sample_ids import ROWS, Samples, check_resumed, recorded, write_dataset  # noqa: E402

RECORDER = "tests.support.loader_record.record_yielded_batches"


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Samples]:
    root = tmp_path_factory.mktemp("ids")
    dataset, tokenizer = write_dataset(root / "dataset"), write_tokenizer(root / "tokenizer")  # the e2e test's
    return dataset, tokenizer, Samples.load(dataset, tokenizer)


@pytest.fixture
def config(assets, monkeypatch: pytest.MonkeyPatch):
    """The trainer's config with both overrides applied, as a rank applies them; the recording is undone after."""
    monkeypatch.setattr(ReshardingDataLoader, "__iter__", ReshardingDataLoader.__iter__)
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel",
                                         "--dataloader.dataset_path", str(assets[0]),
                                         "--override.imports", f"{RESHARDING_DATALOADER},{RECORDER}"])
    applied = apply_overrides(config.override, config)
    from tests.support import loader_record

    loader_record.install()  # imported above by torchtitan; again after an earlier test undid it
    assert [line.split()[1] for line in applied] == [f"{RESHARDING_DATALOADER}:"]  # the recorder claims no node
    assert type(config.dataloader) is ReshardingDataLoader.Config
    return config


def job(config, assets, monkeypatch: pytest.MonkeyPatch, folder: Path, degree: int, steps: int,
        state: dict | None = None) -> tuple[list[list[int]], dict]:
    """`steps` batches of each of `degree` ranks (resumed from `state`) recorded into `folder`: what each rank
    yielded (its input tokens in order), and the checkpoint entry after them."""
    monkeypatch.setenv("SLURM_TITAN_JOB_DIR", str(folder))
    monkeypatch.setenv("SLURM_TITAN_ATTEMPT", f"{folder.name}.0")
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets[1]))
    loaders = [config.dataloader.build(dp_world_size=degree, dp_rank=rank, tokenizer=tokenizer, seq_len=SEQ_LEN,
                                       local_batch_size=LOCAL_BATCH) for rank in range(degree)]
    yielded = []
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)
        yielded.append([t for _ in range(steps) for t in next(batches)[0]["input"].flatten().tolist()])
    return yielded, loaders[0].global_state([(loader.dp_rank, loader.local_state()) for loader in loaders])


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (4, 2), (2, 4)])
def test_records_are_what_was_yielded_and_read_back_as_a_resharded_continuation(
        config, assets, monkeypatch, tmp_path: Path, old: int, new: int) -> None:
    yielded1, state = job(config, assets, monkeypatch, tmp_path / "first", old, 6)
    yielded2, _ = job(config, assets, monkeypatch, tmp_path / "second", new, 3, state)
    first, second = recorded(tmp_path / "first"), recorded(tmp_path / "second")
    assert [first[rank] for rank in range(old)] == yielded1 and [second[rank] for rank in range(new)] == yielded2
    runs = check_resumed(assets[2], first, second)
    tokens = (6 * old + 3 * new) * LOCAL_BATCH * SEQ_LEN
    assert sum(end - start for _, start, end in runs) == tokens  # every token is a sample's
    assert any(start for _, start, _ in runs), "a sample cut by the checkpoint goes on at its offset"


def test_a_replay_from_the_start_is_caught(config, assets, monkeypatch, tmp_path: Path) -> None:
    job(config, assets, monkeypatch, tmp_path / "first", 2, 6)
    job(config, assets, monkeypatch, tmp_path / "second", 1, 3)  # the old "data restarts from the beginning"
    with pytest.raises(AssertionError, match=r"second job, data-parallel rank 0 of 1: sample 0 yielded is "
                                             r"\(id, token\) \(0, 0\), .*: not one left to it: consumed before"):
        check_resumed(assets[2], recorded(tmp_path / "first"), recorded(tmp_path / "second"))


def test_a_skipped_batch_is_caught(config, assets, monkeypatch, tmp_path: Path) -> None:
    _, state = job(config, assets, monkeypatch, tmp_path / "first", 2, 6)
    job(config, assets, monkeypatch, tmp_path / "second", 1, 3, state)
    record = tmp_path / "second/data-record/dp0-rank0.jsonl"
    record.write_text("".join(record.read_text().splitlines(True)[1:]))  # its first batch never reached training
    with pytest.raises(AssertionError, match=r"second job, data-parallel rank 0 of 1: sample 0 yielded .*: "
                                             r"samples before it are missing"):
        check_resumed(assets[2], recorded(tmp_path / "first"), recorded(tmp_path / "second"))


def test_a_sample_yielded_twice_is_caught(assets) -> None:
    samples = assets[2]
    head = list(samples.inputs[0])
    first = {0: head + list(samples.inputs[1])[:5], 1: list(samples.inputs[ROWS // 2])}
    # the second job yields sample 1's first tokens again before going on where the first job left it
    second = {0: list(samples.inputs[1]) + list(samples.inputs[2])}
    with pytest.raises(AssertionError, match=r"sample 0 yielded is \(id, token\) \(1, 0\), its reading order's is "
                                             r"\(1, 5\): samples before it are missing"):
        check_resumed(samples, first, second)


def test_runs_are_read_from_the_tokens_to_a_cut_end_and_a_short_rest_by_the_order(assets) -> None:
    samples = assets[2]
    five, six = (len(samples.inputs[i]) for i in (5, 6))
    stream = [*samples.inputs[5][10:], *samples.inputs[6], *samples.inputs[7][:9]]  # 9 tokens into sample 7
    assert samples.runs(stream, []) == [(5, 10, five), (6, 0, six), (7, 0, 9)]
    stream = stream[:-6]  # 3 tokens into sample 7: BOS and "00", the start of samples 0-99
    with pytest.raises(AssertionError, match=r"stream tokens .* are any of samples \[\(0, 0\), \(1, 0\)"):
        samples.runs(stream, [])
    assert samples.runs(stream, [(5, 10), (6, 0), (7, 0)]) == [(5, 10, five), (6, 0, six), (7, 0, 3)]
    last = [*samples.inputs[8][-1:], *samples.inputs[9][:20]]  # sample 8's last token: the final "." of many
    with pytest.raises(AssertionError, match=r"stream tokens 0.. .* are any of samples"):
        samples.runs(last, [])
    assert samples.runs(last, [(8, len(samples.inputs[8]) - 1), (9, 0)]) == [(8, len(samples.inputs[8]) - 1,
                                                                               len(samples.inputs[8])), (9, 0, 20)]
    with pytest.raises(AssertionError, match="no sample from any token on"):
        samples.runs([samples.bos, samples.bos], [])
