"""checkpoint.remote: an unknown protocol or an object store URL without a bucket is a config error."""

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config
from tests.support.paths import REPO


def write(tmp_path: Path, remote: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: x\ncheckpoint: {{enable: true, remote: {remote!r}}}\n")
    return path


@pytest.mark.parametrize(
    ("remote", "message"),
    [
        ("bogus://host/x", "job.yaml: checkpoint.remote: 'bogus://host/x': unknown protocol 'bogus://'"),
        ("simplecache::bogus://host/x", "job.yaml: checkpoint.remote: 'simplecache::bogus://host/x': unknown protocol"),
        ("s3://", "job.yaml: checkpoint.remote: 's3://' names no bucket: write s3://BUCKET/prefix"),
        ("s3:///runs/x", "job.yaml: checkpoint.remote: 's3:///runs/x' names no bucket"),
        ("gs:///runs", "job.yaml: checkpoint.remote: 'gs:///runs' names no bucket: write gs://BUCKET/prefix"),
    ],
)
def test_bad_remote_names_file_key_and_problem(tmp_path: Path, remote: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, remote))
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


@pytest.mark.parametrize("remote", ["s3://bucket/runs/{name}/{job_id}", "S3://bucket", "/shared/ckpt/{name}",
                                    "file:///shared/ckpt", "simplecache::s3://bucket/x", "hdfs://namenode/ckpt"])
def test_good_remotes_are_accepted(tmp_path: Path, remote: str) -> None:
    assert load_config(write(tmp_path, remote)).checkpoint.remote == remote


def test_dry_run_refuses_a_bogus_remote_in_one_line_without_loading_s3fs(tmp_path: Path) -> None:
    probe = ("import runpy, sys\nsys.argv = ['slurm-titan', 'submit', sys.argv[1], '--dry-run']\n"
             "try:\n    runpy.run_module('slurm_titan.cli.main', run_name='__main__')\n"
             "except SystemExit as done:\n"
             "    print('LOADED:', sorted(m for m in ('s3fs', 'torch') if m in sys.modules), file=sys.stderr)\n"
             "    raise\n")
    config = write(tmp_path, "bogus://host/x")
    result = subprocess.run([sys.executable, "-c", probe, str(config)], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    first, loaded = result.stderr.splitlines()
    assert first.startswith(f"slurm-titan: {config}: checkpoint.remote: 'bogus://host/x': unknown protocol")
    assert loaded == "LOADED: []"
