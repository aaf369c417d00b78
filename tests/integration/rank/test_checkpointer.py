"""The torchtitan hook, built without a trainer (one gloo rank), and a real DCP checkpoint
saved, uploaded, committed, restored and loaded back."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchtitan.components.checkpointer import DATALOADER, BaseCheckpointManager, CheckpointManager
from torchtitan.config import Configurable
from torchtitan.config.override import OverrideConfig, apply_overrides

from slurm_titan.ckpt.catalog import list_checkpoints, read_manifest, verify
from slurm_titan.ckpt.fetch_plan import Wanted
from slurm_titan.ckpt.parts import all_reads
from slurm_titan.ckpt.restore import restore_checkpoint
from slurm_titan.ckpt.storage import open_store
from slurm_titan.ckpt.upload import CheckpointSync
from slurm_titan.envvars import PROGRESS_FILE, RESTORE_FD
from slurm_titan.rank import checkpointer
from slurm_titan.rank.dcp_plan import folder_reads
from slurm_titan.records import rank_progress
from slurm_titan.records.rank_progress import Phase
from slurm_titan.records.restore_verdict import PlanRequest, RestoreVerdict, read_reads


class _Stateful:
    def __init__(self, value: float) -> None:
        self.v = torch.full((8,), value)

    def state_dict(self):
        return {"v": self.v}

    def load_state_dict(self, sd):
        self.v.copy_(sd["v"])


@pytest.fixture
def one_rank(tmp_path):
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _manager(tmp_path, **cfg):
    config = checkpointer.synced_checkpoints(CheckpointManager.Config(enable=True, folder="ckpt", **cfg))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    return config.build(dataloader=None, model_parts=[model], optimizers=_Stateful(1.0),
                        lr_schedulers=_Stateful(2.0), states={}, sd_adapter=None,
                        base_folder=str(tmp_path / "dump")), model


def test_override_replaces_the_checkpoint_manager():
    @dataclass(kw_only=True, slots=True)
    class Root(Configurable.Config):
        checkpoint: BaseCheckpointManager.Config = field(
            default_factory=lambda: CheckpointManager.Config(interval=7, keep_latest_k=3))

    root = Root()
    lines = apply_overrides(OverrideConfig(imports=["slurm_titan.rank.checkpointer.synced_checkpoints"]), root)
    assert len(lines) == 1
    assert type(root.checkpoint) is checkpointer.SyncedCheckpointManager.Config
    assert (root.checkpoint.interval, root.checkpoint.keep_latest_k) == (7, 3)


def test_hook_uploads_commits_and_keeps_local_tidy(location, tmp_path, monkeypatch, one_rank):
    monkeypatch.setenv("SLURM_TITAN_CKPT_REMOTE", location)
    monkeypatch.setenv("SLURM_TITAN_CONFIG_DIGEST", "sha256:test")
    monkeypatch.setenv("SLURM_TITAN_CKPT_KEEP_LOCAL", "2")
    monkeypatch.setenv("SLURM_TITAN_CKPT_KEEP_REMOTE", "2")
    monkeypatch.setenv("SLURM_TITAN_CKPT_UPLOAD_CPUS", str(max(os.sched_getaffinity(0))))
    mgr, model = _manager(tmp_path, interval=2, keep_latest_k=5)
    assert isinstance(mgr, checkpointer.SyncedCheckpointManager) and mgr.sync is not None
    assert mgr.sync.pid != os.getpid()  # uploads run in a child process, outside training's GIL
    mgr.sync.ready()  # started without waiting for it: it takes its CPUs first thing, then opens the store
    assert os.sched_getaffinity(mgr.sync.pid) == {max(os.sched_getaffinity(0))}
    for step in range(1, 7):
        mgr.save(step)
    assert mgr.save_now(7)  # the preemption path: off-interval, full checkpoint
    assert mgr.wait_for_commit(7, timeout=60)
    mgr.close()
    store = open_store(location)
    infos = list_checkpoints(store)
    assert [(i.step, i.complete) for i in infos] == [(6, True), (7, True)]
    m = read_manifest(store, 7)
    assert m.config_digest == "sha256:test" and m.world_size == 1
    assert {f.path for f in m.files} == {".metadata", "__0_0.distcp"}
    size = next(f.size for f in m.files if f.path == "__0_0.distcp")
    assert all_reads(store, m) == [[("__0_0.distcp", 0, size)]]  # DCP's plan of the one rank's load: all of its file
    assert verify(store, 7).ok
    assert sorted(os.listdir(tmp_path / "dump" / "ckpt")) == ["step-6", "step-7"]

    # the committed checkpoint restores and loads back into a fresh model with DCP
    restored = restore_checkpoint(store, str(tmp_path / "restored"), wanted=Wanted([0], 1))
    assert restored.share is not None and not restored.share.blocks
    fresh = torch.nn.Linear(16, 16)
    with torch.no_grad():
        fresh.weight.zero_()
    sd = {k: v for k, v in fresh.state_dict().items()}
    mgr.dcp_load(sd, restored.path, from_hf=False, from_quantized=False)  # checks the share, then loads
    assert torch.equal(sd["weight"], model.weight.detach())


def test_hook_without_remote_is_plain_torchtitan(tmp_path, monkeypatch, one_rank):
    monkeypatch.delenv("SLURM_TITAN_CKPT_REMOTE", raising=False)
    mgr, _ = _manager(tmp_path, interval=1, keep_latest_k=2)
    assert mgr.sync is None
    for step in (1, 2, 3):
        mgr.save(step)
    assert mgr.wait_for_commit(3) is True
    mgr.close()
    assert os.path.isfile(tmp_path / "dump" / "ckpt" / "step-3" / ".metadata")


def test_real_dcp_save_round_trip(location, tmp_path, one_rank):
    """torch.distributed.checkpoint.save -> upload + commit -> restore -> dcp.load gives the same tensors."""
    local = tmp_path / "local"
    state = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10)}
    dcp.save(state, checkpoint_id=str(local / "step-50"))
    assert sorted(os.listdir(local / "step-50")) == [".metadata", "__0_0.distcp"]
    sync = CheckpointSync(location, str(local), rank=0, world_size=1, attempt="x", poll_interval=0.05)
    sync.submit(50)
    assert sync.wait(50, timeout=30) and sync.close(timeout=30)
    store = open_store(location)
    out = restore_checkpoint(store, str(tmp_path / "back"), step=50)
    loaded = {"w": torch.zeros(1000), "b": torch.zeros(10)}
    dcp.load(loaded, checkpoint_id=out.path)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])


def test_the_gate_plans_the_load_torchtitan_will_do_then_takes_the_verdict(tmp_path, monkeypatch, one_rank):
    """On another world size the node asks each rank, at the gate, what its load of the candidate reads: the
    hook answers with DCP's planner on torchtitan's states to load (the data loader excluded, as the verdict
    will have it), still in the start-up phase for the watchdog; the restore phase begins at the verdict."""
    monkeypatch.delenv("SLURM_TITAN_CKPT_REMOTE", raising=False)
    saver, _ = _manager(tmp_path / "old", interval=1)
    saver.save(3)
    saver.close()
    candidate = str(tmp_path / "old" / "dump" / "ckpt" / "step-3")
    progress = tmp_path / "rank-0.progress"
    rank_progress.create(progress, time.time())
    monkeypatch.setenv(PROGRESS_FILE, str(progress))
    monkeypatch.setattr(rank_progress, "_writer", None)
    gate, supervisor = os.pipe()
    monkeypatch.setenv(RESTORE_FD, str(gate))
    answers: dict = {}

    def node() -> None:
        os.write(supervisor, PlanRequest(candidate, str(tmp_path / "reads-0.json")).to_line())
        deadline = time.monotonic() + 60
        while not (tmp_path / "reads-0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        answers["reads"] = read_reads(str(tmp_path / "reads-0.json"))
        answers["phase"] = rank_progress.read(progress).phase
        os.write(supervisor, RestoreVerdict(world_size_changed=True).to_line())
        os.close(supervisor)

    thread = threading.Thread(target=node)
    thread.start()
    mgr, _ = _manager(tmp_path / "new", interval=1)
    thread.join(60)
    assert answers["phase"] == Phase.STARTUP and rank_progress.read(progress).phase == Phase.RESTORE
    assert DATALOADER in mgr.exclude_from_loading
    expected = folder_reads(mgr._states_to_load(model_only=False), candidate)
    assert answers["reads"] == expected and {p for p, _, _ in expected} == {"__0_0.distcp"}
    mgr.close()
