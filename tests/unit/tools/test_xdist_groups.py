"""tools/test's workers keep an xdist group on one worker: the tests that read a run trained once per worker
(tests.support.references.TWELVE_STEP_GROUP) must run where it lives. pytest-xdist's loadgroup stopped grouping
silently once (with pytest 9.2), so this runs a small grouped suite the way tools/test does."""

import os
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, pytest
G = pytest.mark.xdist_group("shared")

@G
@pytest.mark.parametrize("case", range(4))
def test_grouped(case):
    with open(os.environ["WORKERS_SEEN"], "a") as seen:
        seen.write(os.environ["PYTEST_XDIST_WORKER"] + " ")

@pytest.mark.parametrize("case", range(4))
def test_free(case):
    pass
'''


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    seen = tmp_path / "workers"
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                             "loadgroup", "-q", str(tmp_path)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=os.environ | {"WORKERS_SEEN": str(seen)})
    assert result.returncode == 0, result.stdout + result.stderr
    workers = seen.read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
