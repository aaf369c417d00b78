"""The batch shell's lease renewer (node.batch.lease) losing its lease, as real processes on a real store (a folder and
the SeaweedFS server): the renewer and a stand-in batch shell, scancel a recording shim on PATH. Another job took the
lease: the renewer cancels its own job, not the batch shell; a later run of its own job took it (a requeue): it ends
its own batch shell only, and cancels nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from slurm_titan.ckpt import Holder, open_store, read_lease, take_lease
from slurm_titan.ckpt.lease import TTL_S
from tests.support.ckpt import location  # noqa: F401 (fixture)
from tests.support.paths import REPO

RENEWER = """
import sys
from slurm_titan.node.batch.lease import renew_while
from slurm_titan.node.batch_spec import LeasePlan
sys.exit(renew_while(LeasePlan(remote=sys.argv[1]), int(sys.argv[2]), every_s=0.5))
"""
SHIM = "#!/bin/sh\necho \"$0 $*\" >> \"{log}\"\n"


def _renewer(location: str, tmp_path: Path) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    """A stand-in batch shell, and job 7's renewer (run 0) renewing the lease it holds while that shell lives; the
    file the scancel shim records its calls in."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scancel-calls"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(SHIM.format(log=calls))
    (bin_dir / "scancel").chmod(0o755)
    take_lease(open_store(location, check=True, create=True), Holder("7", "0", socket.gethostname()), lambda _: None)
    shell = subprocess.Popen(["sleep", "300"])
    env = os.environ | {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    renewer = subprocess.Popen([sys.executable, "-c", RENEWER, location, str(shell.pid)], cwd=REPO, env=env,
                               stderr=subprocess.PIPE, text=True)
    return shell, renewer, calls


def _renewed(location: str) -> None:
    """Wait until the renewer has renewed the lease once (generation 2)."""
    store = open_store(location, check=True)
    deadline = time.monotonic() + 60
    while read_lease(store).generation < 2:
        assert time.monotonic() < deadline, "the renewer did not renew the lease"
        time.sleep(0.1)


def test_a_renewer_whose_lease_another_job_took_cancels_its_own_job(location, tmp_path):  # noqa: F811
    shell, renewer, calls = _renewer(location, tmp_path)
    try:
        _renewed(location)
        later = lambda: time.time() + TTL_S + 60  # noqa: E731  (job 7's lease has expired by then)
        take_lease(open_store(location, check=True), Holder("8", "0", "n9"), lambda _: "RUNNING", clock=later)
        assert renewer.wait(timeout=60) == 1
        said = renewer.stderr.read()  # type: ignore[union-attr]
        assert "job 8 (run 0 on n9) took the writer lease" in said and "cancelling job 7" in said, said
        assert calls.read_text().split()[1:] == ["7"]
        assert shell.poll() is None  # scancel ends the batch shell, the renewer does not
    finally:
        shell.kill()
        renewer.kill()


def test_a_renewer_whose_lease_a_requeue_of_its_own_job_took_ends_its_batch_shell_only(location, tmp_path):  # noqa: F811
    shell, renewer, calls = _renewer(location, tmp_path)
    try:
        _renewed(location)
        take_lease(open_store(location, check=True), Holder("7", "1", "n9"), lambda _: "RUNNING")
        assert renewer.wait(timeout=60) == 1
        said = renewer.stderr.read()  # type: ignore[union-attr]
        assert "job 7 (run 1 on n9) took the writer lease" in said and "ending this run's batch shell" in said, said
        assert shell.wait(timeout=10) == -15  # SIGTERM
        assert not calls.exists()  # the job lives on in its later run
    finally:
        shell.kill()
        renewer.kill()
