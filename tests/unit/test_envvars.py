"""The SLURM_TITAN_* contract: one module names every variable, and the records that travel together round-trip."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.errors import ConfigError
from slurm_titan.node.spec import CheckpointPlan
from slurm_titan.retention import Retention

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_titan"
NAMES = {value for key, value in vars(envvars).items() if key.isupper() and isinstance(value, str)}


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings (of modules, classes, functions, attributes) left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_no_module_but_envvars_spells_a_variable() -> None:
    spelled = {str(path.relative_to(PACKAGE)): names for path in PACKAGE.rglob("*.py") if path.name != "envvars.py"
               if (names := [s for s in _code_strings(path) if "SLURM_TITAN_" in s])}
    assert spelled == {}


def test_the_templates_name_only_known_variables() -> None:
    for template in (PACKAGE / "launch" / "templates").glob("*.tmpl"):
        assert set(re.findall(r"SLURM_TITAN_[A-Z0-9_]+", template.read_text())) <= NAMES, template


def test_the_checkpoint_settings_round_trip() -> None:
    settings = envvars.RankCheckpointEnv(remote="s3://b/run/7", endpoint_url="http://s3.local:8333",
                                         config_digest="abc", retention=Retention(keep_local=3, keep_remote=2,
                                                                                  keep_every=10),
                                         upload_cpus=frozenset({1, 3}), upload_rate=3500.0)
    env = settings.to_env()
    assert env[envvars.CKPT_UPLOAD_CPUS] == "1,3" and env[envvars.CKPT_UPLOAD_RATE] == "3500"
    assert envvars.RankCheckpointEnv.from_env(env) == settings
    assert envvars.RankCheckpointEnv.from_env({}) is None
    assert envvars.RankCheckpointEnv.from_env({envvars.CKPT_REMOTE: "/r"}) == envvars.RankCheckpointEnv(remote="/r")
    unset_keep_local = envvars.RankCheckpointEnv.from_env({envvars.CKPT_REMOTE: "/r"}, default_keep_local=5)
    assert unset_keep_local is not None and unset_keep_local.retention == Retention(keep_local=5)
    with pytest.raises(ConfigError, match=f"{envvars.CKPT_KEEP_LOCAL}: must be >= 0"):
        envvars.RankCheckpointEnv.from_env({envvars.CKPT_REMOTE: "/r", envvars.CKPT_KEEP_LOCAL: "-1"})
    with pytest.raises(ConfigError, match=envvars.CKPT_UPLOAD_CPUS):
        envvars.RankCheckpointEnv.from_env({envvars.CKPT_REMOTE: "/r", envvars.CKPT_UPLOAD_CPUS: "3-1"})
    for bad, why in (("fast", "not a number: 'fast'"), ("-1", "must be >= 0, got -1"), ("nan", "must be >= 0")):
        with pytest.raises(ConfigError, match=f"{envvars.CKPT_UPLOAD_RATE}: {why}"):
            envvars.RankCheckpointEnv.from_env({envvars.CKPT_REMOTE: "/r", envvars.CKPT_UPLOAD_RATE: bad})


def test_the_plan_fills_in_the_remote_for_the_job() -> None:
    plan = CheckpointPlan(local="/local", remote="s3://b/run/{job_id}/ckpt", retention=Retention(keep_local=2),
                          config_digest="abc")
    assert plan.remote_for("77") == "s3://b/run/77/ckpt" == plan.rank_env("77")[envvars.CKPT_REMOTE]
    assert plan.remote_root() == "s3://b/run"
    assert CheckpointPlan(local="/local", remote="/shared/ckpt").remote_root() == "/shared/ckpt"
    no_remote = CheckpointPlan(local="/local", retention=Retention(keep_local=2), config_digest="abc")
    assert no_remote.remote_for("77") is None and no_remote.remote_root() is None and no_remote.rank_env("77") == {}


def test_the_attempt_id_carries_its_number(tmp_path: Path) -> None:
    assert envvars.attempt_number(envvars.attempt_id("42", 3)) == 3 and envvars.attempt_number("") == 0
    sent = envvars.RankAttemptEnv(tmp_path, envvars.attempt_id("42", 3), tmp_path / "stop")
    assert envvars.RankAttemptEnv.from_env(sent.to_env()) == sent and sent.attempt == 3
    assert envvars.RankAttemptEnv.from_env({}) is None
