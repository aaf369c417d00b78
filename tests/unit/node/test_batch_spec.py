"""The batch spec: what the batch shell's processes read from the job folder (node.batch_spec)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_titan.node.batch import allocation, titan_check
from slurm_titan.node.batch_spec import BatchSpec, BatchSpecError, LeasePlan, load_or_exit
from slurm_titan.records import run_folder
from tests.support.batch_specs import SPEC, write_batch_spec


def test_a_spec_reads_back_equal(tmp_path: Path) -> None:
    spec = write_batch_spec(tmp_path, shrink_to=(3, 2, 1), titan_module="my.models")
    assert BatchSpec.load(tmp_path) == spec
    assert BatchSpec.from_json(replace(SPEC, shrink_to=()).to_json()) == SPEC
    assert json.loads(spec.to_json())["format"] == 1
    assert "lease" not in json.loads(spec.to_json())  # the scripts of jobs without one stay as they were
    leased = replace(SPEC, lease=LeasePlan(remote="s3://b/runs/x/exp-1", take_over=True))
    assert BatchSpec.from_json(leased.to_json()) == leased
    assert "standby_step" not in json.loads(spec.to_json())
    standby = replace(SPEC, standby_step=True)
    assert BatchSpec.from_json(standby.to_json()) == standby


@pytest.mark.parametrize(("text", "problem"), [
    (None, "no batch spec (the sbatch script writes it before anything else runs)"),
    ("{not json", "malformed batch spec (Expecting property name"),
    ("[1]", "malformed batch spec (not a JSON object)"),
    ('{"format": 2}', "malformed batch spec (format 2, expected 1)"),
    ('{"format": 1, "nodes": 2}', "malformed batch spec (retry missing)"),
    (SPEC.to_json().replace('"nodes": 2', '"nodes": "2"'), "malformed batch spec (nodes: '2' is not an int)"),
    (SPEC.to_json().replace('"max_failures": 5', '"max_failures": true'),
     "malformed batch spec (retry.max_failures: True is not an int)"),
])
def test_a_missing_or_malformed_spec_is_one_line_naming_the_file(tmp_path: Path, text: str | None,
                                                                  problem: str) -> None:
    path = run_folder.batch_spec_file(tmp_path)
    if text is not None:
        path.write_text(text)
    with pytest.raises(BatchSpecError) as raised:
        BatchSpec.load(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {problem}") and "\n" not in message


def test_a_process_without_its_spec_exits_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for main in (load_or_exit, lambda folder: allocation.main(["--job-dir", str(folder)]),
                 lambda folder: titan_check.main(["--job-dir", str(folder)])):
        with pytest.raises(SystemExit) as exited:
            main(tmp_path)
        assert exited.value.code == 1
        assert capsys.readouterr().err == f"slurm-titan: {run_folder.batch_spec_file(tmp_path)}: no batch spec " \
                                          "(the sbatch script writes it before anything else runs)\n"


def test_titan_check_reads_the_module_and_config_from_the_spec(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    write_batch_spec(tmp_path)
    assert titan_check.main(["--job-dir", str(tmp_path)]) == 0
    write_batch_spec(tmp_path, titan_config="llama3_tiny")
    assert titan_check.main(["--job-dir", str(tmp_path)]) == 2
    assert "torchtitan config 'llama3_tiny' not found in module 'llama3'" in capsys.readouterr().out


def test_allocation_takes_the_spec_node_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    write_batch_spec(tmp_path, nodes=2)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.setattr(allocation, "unhealthy_nodes", lambda hosts: {"n1"})
    assert allocation.main(["--job-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export SLURM_TITAN_ATTEMPT_INDEX=0", "export SLURM_TITAN_NODES=n2,n3", "export SLURM_TITAN_NUM_NODES=2"]
