"""Runs by name: which run a job joins and where its checkpoints go (`--run`, `--resume`, `--fresh`), from the run
registry; and what is refused before anything is submitted, with Slurm's answers recorded (fake) and a folder as the
checkpoint location."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_titan import slurm
from slurm_titan.ckpt import Holder, Manifest, layout, open_store, take_lease
from slurm_titan.cli.main import main
from slurm_titan.errors import ConfigError, ExitCode, RunError
from slurm_titan.launch import run_binding
from slurm_titan.launch.config import load_config
from slurm_titan.launch.config_digest import config_digest
from slurm_titan.launch.plan import plan_job
from slurm_titan.launch.run_binding import bind, check
from slurm_titan.node.spec import CheckpointPlan, NodeSpec
from slurm_titan.node.supervisor.supervisor import NodeSupervisor
from slurm_titan.records import jobs, run_registry
from tests.support.plans import pinned_debug_cpu


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def config(tmp_path: Path, home: Path):
    return load_config(pinned_debug_cpu(tmp_path), [("checkpoint.remote", str(tmp_path / "store/{name}/{job_id}"))])


def slurm_says(monkeypatch: pytest.MonkeyPatch, states: dict[str, str]) -> None:
    """Slurm's answers, recorded: `states` of the jobs it knows."""
    known = {job: slurm.JobState(job, state, "", "", 0, "", "scontrol") for job, state in states.items()}
    monkeypatch.setattr(slurm, "job_states", lambda ids: {job: known[job] for job in ids if job in known})
    monkeypatch.setattr(slurm, "job_state", lambda job: known.get(job))


def committed(location: str, step: int, config) -> None:
    """A complete checkpoint of `config` as a listing and a submit see it: its commit record (no files) and its
    catalog entry."""
    store = open_store(location, check=True, create=True)
    store.put_bytes(layout.commit_path(step), Manifest(step, 2, [], "xxh3_128", config_digest(config)).to_json())
    store.put_bytes(layout.catalog_entry(step, 2, 0, 0), b"{}")


def test_a_new_run_takes_its_location_from_the_config_with_its_name_for_the_job_id(config, tmp_path):
    planned, binding = bind(config, run="exp-1")
    assert binding.remote == planned.checkpoint.remote == str(tmp_path / "store/debug-cpu/exp-1")
    assert (planned.run, binding.known, binding.fixed) == ("exp-1", None, True)
    lease = plan_job(planned).batch.lease
    assert lease is not None and lease.remote == binding.remote and not lease.take_over
    assert plan_job(config).batch.lease is None  # a location of one job's own: no lease


def test_a_run_stays_where_its_first_job_put_it_when_the_config_changes(config, tmp_path, capsys):
    run_binding.record(bind(config, run="exp-1")[1], "101")
    moved = load_config(pinned_debug_cpu(tmp_path), [("checkpoint.remote", str(tmp_path / "elsewhere/{job_id}"))])
    planned, binding = bind(moved, run="exp-1")
    assert planned.checkpoint.remote == str(tmp_path / "store/debug-cpu/exp-1")
    assert "run exp-1 stays at" in capsys.readouterr().err
    run_binding.record(binding, "102")
    assert run_registry.load("exp-1").jobs == ["101", "102"]


def test_the_config_can_name_the_run(tmp_path, home):
    config = load_config(pinned_debug_cpu(tmp_path), [("run", "from-config")])
    assert bind(config)[1].remote == "s3://slurm-titan/runs/debug-cpu/from-config"
    with pytest.raises(ConfigError, match=r"debug_cpu.yaml: run: 'a/b' is not a run name"):
        load_config(pinned_debug_cpu(tmp_path), [("run", "a/b")])


@pytest.mark.parametrize("name", ["a/b", "..", "123", "-x", ""])
def test_a_run_name_that_is_no_path_component_is_refused_in_one_line(config, name):
    with pytest.raises(ConfigError, match="--run: .* is not a run name") as refused:
        bind(config, run=name)
    assert refused.value.exit_code == ExitCode.CONFIG


def test_resume_finds_a_run_a_job_or_a_location_and_refuses_what_is_not_there(config, tmp_path):
    run_binding.record(bind(config, run="exp-1")[1], "101")
    jobs.save(jobs.new_record("101", "debug-cpu", tmp_path, "c.yaml", 2, "exp-1", str(tmp_path / "x")))
    assert bind(config, resume="exp-1")[1].name == bind(config, resume="101")[1].name == "exp-1"
    with pytest.raises(RunError, match=r"--resume nope: no run or job nope was submitted from here \(runs: exp-1"):
        bind(config, resume="nope")
    with pytest.raises(ConfigError, match="--resume: /some/where: name the run .*--run NAME"):
        bind(config, resume="/some/where")
    assert bind(config, resume="/some/where/", run="adopted")[1].remote == "/some/where"
    with pytest.raises(ConfigError, match="--fresh: starts at step 1; --resume continues"):
        bind(config, resume="exp-1", fresh=True)


def test_resume_of_a_job_from_before_runs_had_names_reads_its_location_from_its_job_folder(config, tmp_path):
    from submitit.core.utils import DelayedSubmission

    folder = tmp_path / "runs/debug-cpu/77"
    folder.mkdir(parents=True)
    spec = NodeSpec(name="debug-cpu", device="cpu", procs_per_node=1, port_window=(1, 2), job_dir=str(folder),
                    rank_argv=(), checkpoint=CheckpointPlan(local="/l", remote="s3://b/runs/debug-cpu/{job_id}"))
    DelayedSubmission(NodeSupervisor(spec)).dump(folder / "77_submitted.pkl")
    jobs.save(jobs.JobRecord("77", "debug-cpu", str(folder), "c.yaml", 2, 0.0))  # no run, no remote: an old record
    planned, binding = bind(config, resume="77")
    assert (binding.name, binding.remote, binding.resume) == ("debug-cpu-77", "s3://b/runs/debug-cpu/77", True)
    assert planned.checkpoint.remote == "s3://b/runs/debug-cpu/77"


def test_check_refuses_a_fresh_start_or_a_new_run_where_checkpoints_are(config, monkeypatch):
    slurm_says(monkeypatch, {})
    binding = bind(config, run="exp-1")[1]
    assert check(binding, config) == f"run exp-1 starts at step 1 (no complete checkpoint there) of {binding.remote}"
    committed(binding.remote, 8, config)
    with pytest.raises(RunError, match=r"holds checkpoints \(newest complete: step 8\) and run exp-1 is new here"):
        check(binding, config)
    with pytest.raises(RunError, match="and --fresh starts at step 1: continue them with --resume"):
        check(bind(config, run="exp-1", fresh=True)[1], config)
    run_binding.record(binding, "101")
    assert check(bind(config, run="exp-1")[1], config) == f"run exp-1 resumes from step 8 of {binding.remote}"


def test_check_refuses_while_a_job_of_the_run_or_the_lease_holder_runs(config, monkeypatch):
    binding = bind(config, run="exp-1")[1]
    run_binding.record(binding, "101")
    slurm_says(monkeypatch, {"101": "PENDING"})
    with pytest.raises(RunError, match=r"run exp-1: job 101 is PENDING in Slurm .*slurm-titan cancel 101"):
        check(bind(config, run="exp-1")[1], config)
    store = open_store(binding.remote, check=True, create=True)
    take_lease(store, Holder("555", "0", "n9"), lambda job: None)
    slurm_says(monkeypatch, {"101": "COMPLETED", "555": "RUNNING"})
    with pytest.raises(RunError, match=r"job 555 \(run 0 on n9\) writes here \(RUNNING in Slurm\)"):
        check(bind(config, run="exp-1")[1], config, take_over=True)
    slurm_says(monkeypatch, {"101": "COMPLETED"})  # the holder unknown to Slurm: only --take-over takes it
    with pytest.raises(RunError, match="holds the writer lease for .*--take-over"):
        check(bind(config, run="exp-1")[1], config)
    assert "(writer lease: taken over from job 555" in check(bind(config, run="exp-1")[1], config, take_over=True)
    store.put_bytes(layout.lease_path(9), b"garbage")
    with pytest.raises(RunError, match=r"g-0000000009.json: corrupt lease"):
        check(bind(config, run="exp-1")[1], config)


def test_bad_input_is_one_line_and_exit_2_before_anything_is_submitted(tmp_path, home, capsys, monkeypatch):
    monkeypatch.setattr("slurm_titan.launch.submit.submit", lambda *a: pytest.fail("submitted"))
    config = str(pinned_debug_cpu(tmp_path))
    for args, said in ((["--run", "a b"], "--run: 'a b' is not a run name"),
                       (["--resume", "4711"], "--resume 4711: no run or job 4711 was submitted from here")):
        assert main(["submit", config, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err


@pytest.mark.parametrize(("change", "key"), [
    (("torchtitan.config", "llama3_8b"), "torchtitan.config"),
    (("torchtitan.args.optimizer.name", "SGD"), "torchtitan.args.optimizer.name"),
    (("torchtitan.args.model", {"dim": 512}), "torchtitan.args.model"),
    (("torchtitan.debug_assets", None), "torchtitan.args.hf_assets_path"),
])
def test_a_later_job_that_cannot_load_the_runs_checkpoint_is_refused_naming_the_key(config, tmp_path, monkeypatch,
                                                                                 change, key):
    slurm_says(monkeypatch, {})
    binding = bind(config, run="exp-1")[1]
    committed(binding.remote, 8, config)
    run_binding.record(binding, "101")
    allowed = [("torchtitan.args.training.steps", 40), ("torchtitan.args.lr_scheduler.warmup_steps", 9),
               ("slurm.nodes", 1), ("checkpoint.interval", 2), ("torchtitan.args.dataloader.num_workers", 2)]
    same = load_config(pinned_debug_cpu(tmp_path), [("checkpoint.remote", str(tmp_path / "x/{job_id}")), *allowed])
    assert check(bind(same, run="exp-1")[1], same) == f"run exp-1 resumes from step 8 of {binding.remote}"
    other = load_config(pinned_debug_cpu(tmp_path), [change])
    with pytest.raises(ConfigError, match=rf"debug_cpu.yaml: {key}: differs from the job that saved checkpoint step 8 "
                                          "of .*exp-1: a checkpoint loads only into"):
        check(bind(other, run="exp-1")[1], other)


def test_two_submits_that_record_one_new_run_at_once_both_keep_their_job_and_only_another_location_is_refused(home):
    run_registry.create("exp-9", "s3://b/exp-9", None, "101")
    assert run_registry.create("exp-9", "s3://b/exp-9", None, "102").jobs == ["101", "102"]
    assert run_registry.load("exp-9").jobs == ["101", "102"]  # type: ignore[union-attr]
    with pytest.raises(RunError, match="recorded meanwhile by another submit at s3://b/exp-9; job 103 writes to"):
        run_registry.create("exp-9", "s3://b/elsewhere", None, "103")
