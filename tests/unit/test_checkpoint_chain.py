"""The `checkpoint:` settings from the YAML to the uploader: one typed bundle per process boundary (node.spec's
docstring names them), every setting under its YAML name all the way."""

import json
import pickle
from pathlib import Path

from slurm_titan.ckpt import CheckpointSync, UploadSettings
from slurm_titan.envvars import RankCheckpointEnv
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
from slurm_titan.retention import Retention
from tests.support.plans import pinned_debug_cpu


def test_each_checkpoint_setting_reaches_the_uploader_under_its_yaml_name(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    yaml_values = {"remote": f"{remote}/{{name}}/%j", "endpoint_url": "http://127.0.0.1:8333", "keep_local": 3,
                   "keep_remote": 4, "keep_every": 50, "upload_cpus": "1,3"}
    sets = [(f"checkpoint.{key}", value) for key, value in yaml_values.items()]
    config = load_config(pinned_debug_cpu(tmp_path), sets)
    spec = config.checkpoint
    assert {key: getattr(spec, key) for key in yaml_values} == yaml_values
    retention = Retention(keep_local=3, keep_remote=4, keep_every=50)
    assert spec.retention == retention

    # login node -> node supervisor: the NodeSpec submitit pickles
    plan = pickle.loads(pickle.dumps(plan_job(config).node)).checkpoint
    assert plan is not None and plan.remote == f"{remote}/debug-cpu/{{job_id}}"
    assert plan.remote_for("77") == f"{remote}/debug-cpu/77" and plan.remote_root() == f"{remote}/debug-cpu"
    # node supervisor -> rank: the environment
    rank_env = RankCheckpointEnv.from_env(plan.rank_env("77"))
    assert rank_env is not None
    # rank -> its uploader process: the first JSON line it reads
    sent = UploadSettings.from_rank_env(rank_env, local_folder=str(tmp_path / "local"), rank=0, world_size=1)
    received = UploadSettings.from_message(json.loads(json.dumps(sent.to_message())))
    assert received == sent

    arrives = {"remote": f"{remote}/debug-cpu/77", "endpoint_url": "http://127.0.0.1:8333",
               "retention": retention, "upload_cpus": frozenset({1, 3}), "config_digest": plan.config_digest}
    for bundle in (rank_env, sent, received):
        assert {key: getattr(bundle, key) for key in arrives} == arrives, type(bundle).__name__
    assert {key: getattr(plan, key) for key in arrives if key != "remote"} == {
        key: value for key, value in arrives.items() if key != "remote"}

    sync = CheckpointSync.from_settings(received)  # what the child runs
    assert sync.store.location == arrives["remote"] and sync.cpus == arrives["upload_cpus"]
    assert (sync.keep_local, sync.keep_remote, sync.keep_every) == (3, 4, 50)
    assert sync.config_digest == plan.config_digest != ""
