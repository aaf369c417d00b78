"""The job folder part of the scale harness on a small configuration: the slow file system counts what the
project's folder code does, and 4 nodes agree and report through it (tools/bench/scale_sim/folder.py). Counts and
outcomes only: the times it measures are the benchmark's, not the test's."""

import os
from pathlib import Path

import pytest

from tools.bench.scale_sim import folder
from tools.local_fs.slow_fs import SlowFs

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="needs /dev/fuse (FUSE in this kernel)")


def test_the_slow_file_system_counts_each_kind_and_records_touches(tmp_path):
    with SlowFs(tmp_path / "backing", [tmp_path / "a", tmp_path / "b"], delay_s=0.001) as fs:
        a, b = fs.mountpoints  # two clients of one server
        before = fs.stats()
        (a / "d").mkdir()
        (a / "d" / "f").write_text("hello")
        (a / "d" / "f").touch()
        assert os.listdir(b / "d") == ["f"]
        assert (b / "d" / "f").read_text() == "hello"
        os.replace(b / "d" / "f", b / "d" / "g")
        after = fs.stats()
    ops = {kind: n - before["metadata"].get(kind, 0) for kind, n in after["metadata"].items()}
    for kind in ("mkdir", "create", "utimens", "opendir", "readdir", "open", "rename"):
        assert ops[kind] == 1, (kind, ops)
    assert ops["getattr"] >= 10  # every path walk looks each name up again: no kernel cache
    assert after["bytes"] == {"write": 5, "read": 5}
    assert list(after["touches"]) == ["/d/f"]
    assert (tmp_path / "backing" / "d" / "g").read_text() == "hello"  # passed through
    assert not os.path.ismount(a) and not os.path.ismount(b) and fs.final is not None  # unmounted, last stats kept


def test_four_nodes_agree_and_report_through_the_slow_file_system(tmp_path):
    row = folder.measure(32, tmp_path, delay_s=0.005)  # counts and outcomes: 5 ms is as good as 20
    assert row["nodes"] == 4 and row["agree_ok"] == 4  # every node's agreement completed, accepting the step
    assert row["agree_open"] <= 2 * 4  # each node's acceptance created (a name), none read by the others
    assert row["agree_list"] >= 3 * 4  # one listing a poll: opendir, readdir, releasedir
    assert row["agree_lookup"] > row["agree_open"]  # a lookup per name of each path
    assert row["ram_ok"] == 4  # every node gathered every holding
    assert row["ram_open"] <= 6 * 4  # each publishes one; node 0 reads them and writes one; the others read that one
    assert row["report_ops"] > 0 and row["report_list"] >= 3 * 4  # reports written, peers waited for
    assert row["report_requeued"] == 0  # the batch shell lived (the probe answers in any case)
    # the batch shell's read of the reports: the folder walked once, then ~4 a report (a name); a walk a report, 56
    assert row["report_read_ok"] == 4 and row["report_read_ops"] <= 30 + 4 * 4
    assert row["heartbeat_touches"] >= 2 and 0 < row["heartbeat_gap_max_s"] < float("inf")  # measured
