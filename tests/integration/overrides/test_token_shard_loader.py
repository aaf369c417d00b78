"""The token-shard loader in torchtitan's debug-model config, on the debug assets prepared by `slurm-titan data
prepare` (CPU, no process group; data-parallel degrees simulated by one loader per rank, as
test_loader_record.py does): it yields exactly what today's (resharding) loader yields for the same text,
its position reshards with every unconsumed token read once (tests/support/sample_ids.py reads the records
back), and bad shards are refused in one line at start."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan.config import apply_overrides  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402

from slurm_titan.cli.main import main as cli_main  # noqa: E402
from slurm_titan.data.cursor import DataResumeError  # noqa: E402
from slurm_titan.data.token_names import ShardError  # noqa: E402
from slurm_titan.launch.debug_assets import write_tokenizer  # noqa: E402
from slurm_titan.overrides import TOKEN_SHARD_DATALOADER  # noqa: E402
from slurm_titan.overrides.resharding_loader import ReshardingDataLoader  # noqa: E402
from slurm_titan.overrides.token_shard_loader import TokenShardDataLoader  # noqa: E402
from tests.integration.overrides.test_resharding_loader import batches, checkpoint, same  # noqa: E402
from tests.support.sample_ids import Samples, check_resumed, recorded, write_dataset  # noqa: E402

SEQ, BATCH = 256, 4  # the debug config's sequence and local batch
ROWS = 400


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Samples]:
    """The e2e tests' id-led documents and debug tokenizer, and their token shards made by the CLI."""
    root = tmp_path_factory.mktemp("shards")
    dataset, tokenizer = write_dataset(root / "dataset", ROWS), write_tokenizer(root / "tokenizer")
    assert cli_main(["data", "prepare", str(dataset), "--tokenizer", str(tokenizer), "--output", str(root / "shards"),
                     "--documents-per-shard", "150", "--workers", "2"]) == 0
    return dataset, tokenizer, root / "shards", Samples.load(dataset, tokenizer)


def load(tokenizer: Path) -> HuggingFaceTokenizer:
    return HuggingFaceTokenizer(tokenizer_path=str(tokenizer))


def config(dataset_path: Path, target: str = TOKEN_SHARD_DATALOADER):
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel",
                                         "--dataloader.dataset", "token_shards",
                                         "--dataloader.dataset_path", str(dataset_path), "--override.imports", target])
    applied = apply_overrides(config.override, config)
    assert [line.split()[1] for line in applied] == [f"{TOKEN_SHARD_DATALOADER}:"]
    assert type(config.dataloader) is TokenShardDataLoader.Config
    return config


def build(cfg, tokenizer: Path, degree: int, rank: int, **changes):
    loader_cfg = cfg.dataloader
    for key, value in changes.items():
        setattr(loader_cfg, key, value)
    return loader_cfg.build(dp_world_size=degree, dp_rank=rank, tokenizer=load(tokenizer), seq_len=SEQ,
                            local_batch_size=BATCH)


def text_loader(dataset: Path, tokenizer: Path, degree: int, rank: int, infinite: bool = False):
    cfg = ReshardingDataLoader.Config(dataset="c4_test", dataset_path=str(dataset), infinite=infinite)
    return ReshardingDataLoader(cfg, dp_world_size=degree, dp_rank=rank, tokenizer=load(tokenizer), seq_len=SEQ,
                                local_batch_size=BATCH)


def streams(loaders: list, steps: int | None) -> dict[int, list[int]]:
    return {ld.dp_rank: [t for inputs, _ in batches(iter(ld), steps) for t in inputs["input"].flatten().tolist()]
            for ld in loaders}


def test_prepare_is_resumable_and_refuses_other_settings(assets, tmp_path: Path, capsys) -> None:
    dataset, tokenizer, shards, _ = assets
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["documents"] == ROWS and [s["documents"] for s in manifest["shards"]] == [150, 150, 100]
    copy = tmp_path / "again"
    shutil.copytree(shards, copy)
    (copy / "shard-00001.idx").unlink()
    (copy / "manifest.json").unlink()
    assert cli_main(["data", "prepare", str(dataset), "--tokenizer", str(tokenizer), "--output", str(copy),
                     "--documents-per-shard", "150", "--workers", "1"]) == 0
    assert (copy / "manifest.json").read_text() == (shards / "manifest.json").read_text()
    assert (copy / "shard-00001.bin").read_bytes() == (shards / "shard-00001.bin").read_bytes()
    assert cli_main(["data", "prepare", str(dataset), "--tokenizer", str(tokenizer), "--output", str(copy),
                     "--documents-per-shard", "100"]) == 1
    assert capsys.readouterr().err == (f"slurm-titan: {copy}: being prepared with other settings "
                                       "(documents_per_shard differ); prepare into an empty folder\n")


@pytest.mark.parametrize("degree", [1, 2])
def test_yields_exactly_what_the_text_loader_yields_for_the_same_text(assets, degree: int) -> None:
    dataset, tokenizer, shards, _ = assets
    cfg = config(shards)
    for rank in range(degree):
        ours = batches(iter(build(cfg, tokenizer, degree, rank, infinite=False)), None)
        theirs = batches(iter(text_loader(dataset, tokenizer, degree, rank)), None)
        assert len(ours) > 5 and same(ours, theirs)


def test_same_degree_resume_is_bit_identical_across_epochs(assets) -> None:
    _, tokenizer, shards, _ = assets
    cfg = config(shards)
    whole = batches(iter(build(cfg, tokenizer, 2, 1, infinite=True)), 60)  # ~19 batches an epoch
    for cut in (1, 20, 41):
        first = [build(cfg, tokenizer, 2, r, infinite=True) for r in range(2)]
        head = batches(iter(first[1]), cut)
        state = checkpoint(first)
        again = [build(cfg, tokenizer, 2, r, infinite=True) for r in range(2)]
        for ld in again:
            ld.load_state_dict(state)
        assert same(head + batches(iter(again[1]), 60 - cut), whole)


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 4)])
def test_reshard_reads_every_unconsumed_token_exactly_once(assets, old: int, new: int) -> None:
    """What the e2e tests check from the records of the loaders of two jobs (sample_ids.check_resumed)."""
    _, tokenizer, shards, samples = assets
    cfg = config(shards)
    first = [build(cfg, tokenizer, old, r, infinite=False) for r in range(old)]
    before = streams(first, 3)
    state = checkpoint(first)
    after = [build(cfg, tokenizer, new, r, infinite=False) for r in range(new)]
    for ld in after:
        ld.load_state_dict(state)
    runs = check_resumed(samples, before, streams(after, None))
    consumed = {}
    for ident, start, end in runs:
        for token in range(start, end):
            assert (ident, token) not in consumed
            consumed[(ident, token)] = True


def test_kwargs_reach_the_loader(assets) -> None:
    _, tokenizer, shards, _ = assets
    cfg = config(shards, f'{TOKEN_SHARD_DATALOADER}={{"restart_data": true, "seed": 7}}')
    loader = build(cfg, tokenizer, 1, 0)
    assert (loader.reshards, loader.dataset.seed) == (False, 7)


def test_another_tokenizer_is_refused_in_one_line(assets, tmp_path: Path) -> None:
    _, _, shards, _ = assets
    other = write_tokenizer(tmp_path / "other", vocab_size=1500, seed=3)
    with pytest.raises(ShardError, match="made with another tokenizer") as refused:
        build(config(shards), other, 1, 0)
    assert "\n" not in str(refused.value) and str(shards / "manifest.json") in str(refused.value)


def test_changed_shards_are_refused_on_resume_unless_allowed(assets, tmp_path: Path) -> None:
    dataset, tokenizer, shards, _ = assets
    state = checkpoint([build(config(shards), tokenizer, 1, 0)])
    saved = pickle.loads(state["world_size"])
    assert saved["dataset"]["kind"] == "token-shards" and saved["dataset"]["rows"] == ROWS
    fewer = tmp_path / "fewer"
    assert cli_main(["data", "prepare", str(dataset), "--tokenizer", str(tokenizer), "--output", str(fewer),
                     "--documents-per-shard", "200"]) == 0
    with pytest.raises(DataResumeError, match="another dataset") as refused:
        build(config(fewer), tokenizer, 1, 0).load_state_dict(state)
    assert "\n" not in str(refused.value)
    build(config(fewer), tokenizer, 1, 0, allow_dataset_change=True).load_state_dict(state)


def test_a_text_loader_checkpoint_is_refused(assets) -> None:
    dataset, tokenizer, shards, _ = assets
    state = checkpoint([text_loader(dataset, tokenizer, 1, 0)])
    with pytest.raises(DataResumeError, match="another dataset .*kind map-style -> token-shards"):
        build(config(shards), tokenizer, 1, 0).load_state_dict(state)
    with pytest.raises(DataResumeError, match="for a map-style dataset, this one is token-shards"):
        build(config(shards), tokenizer, 1, 0, allow_dataset_change=True).load_state_dict(state)


def test_the_e2e_recorder_records_the_token_shard_loader(assets, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """tests/support/loader_record.py (the e2e tests' override) next to the token-shard override: records what
    each rank yielded, which sample_ids reads back as a resharded continuation."""
    _, tokenizer, shards, samples = assets
    monkeypatch.setattr(ReshardingDataLoader, "__iter__", ReshardingDataLoader.__iter__)
    cfg = config(shards, f"{TOKEN_SHARD_DATALOADER},tests.support.loader_record.record_yielded_batches")
    from tests.support import loader_record

    loader_record.install()  # imported above by torchtitan; again after an earlier test undid it
    yielded, state = {}, None
    for job, degree, steps in (("first", 2, 4), ("second", 1, 3)):
        monkeypatch.setenv("SLURM_TITAN_JOB_DIR", str(tmp_path / job))
        monkeypatch.setenv("SLURM_TITAN_ATTEMPT", f"{job}.0")
        loaders = [build(cfg, tokenizer, degree, r, infinite=False) for r in range(degree)]
        for ld in loaders:
            if state is not None:
                ld.load_state_dict(state)
        yielded[job] = streams(loaders, steps)
        state = checkpoint(loaders)
    first, second = recorded(tmp_path / "first"), recorded(tmp_path / "second")
    assert (first, second) == (yielded["first"], yielded["second"])
    check_resumed(samples, first, second)


def test_index_writes_the_manifest_of_shards_made_elsewhere(assets, tmp_path: Path) -> None:
    _, tokenizer, shards, _ = assets
    elsewhere = tmp_path / "megatron"
    elsewhere.mkdir()
    for path in shards.glob("shard-*"):
        shutil.copy(path, elsewhere / path.name)
    assert cli_main(["data", "index", str(elsewhere), "--tokenizer", str(tokenizer)]) == 0
    made, indexed = (json.loads((f / "manifest.json").read_text()) for f in (shards, elsewhere))
    assert {**made, "source": None} == {**indexed, "source": None}


def test_prepare_names_a_bad_line_and_a_missing_tokenizer_in_one_line(assets, tmp_path: Path, capsys) -> None:
    _, tokenizer, _, _ = assets
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "Ka lo."}\n{"body": "no text"}\n')
    assert cli_main(["data", "prepare", str(bad), "--tokenizer", str(tokenizer), "--output", str(tmp_path / "o"),
                     "--workers", "1"]) == 1
    assert capsys.readouterr().err == (f"slurm-titan: {bad}: line 2 after byte 0 is not a JSON object with a 'text' "
                                       "field\n")
    assert cli_main(["data", "prepare", str(bad), "--tokenizer", str(tmp_path / "none"), "--output",
                     str(tmp_path / "p")]) == 1
    assert capsys.readouterr().err.startswith(f"slurm-titan: {tmp_path / 'none'}: cannot load the tokenizer: ")
