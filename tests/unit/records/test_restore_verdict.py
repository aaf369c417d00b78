"""The messages of the restore gate: verdict and plan request lines, a rank's reads file."""

from __future__ import annotations

import pytest

from slurm_titan.records.restore_verdict import PlanRequest, RestoreVerdict, parse_line, read_reads, write_reads


def test_messages_are_json_lines_that_parse_back():
    for message in (RestoreVerdict(), RestoreVerdict(world_size_changed=True), PlanRequest("/l/.planning-5-7", "/r")):
        line = message.to_line()
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert parse_line(line) == message


@pytest.mark.parametrize("line", [b'{"plan": {"metadata": "/x"}}', b'{"other": 1}', b"[1]", b'{"verdict": {"x": 1}}',
                                  b"{tru"])
def test_a_line_that_is_no_message_is_refused_in_one_line(line):
    with pytest.raises(ValueError, match="not a restore gate message") as e:
        parse_line(line)
    assert "\n" not in str(e.value)


def test_reads_files_hold_the_reads_or_why_there_are_none(tmp_path):
    path = str(tmp_path / "reads-3.json")
    write_reads(path, [("__0_0.distcp", 10, 20), (".metadata", 0, 5)])
    assert read_reads(path) == [("__0_0.distcp", 10, 20), (".metadata", 0, 5)]
    assert [p.name for p in tmp_path.iterdir()] == ["reads-3.json"]
    write_reads(path, None, "KeyError: 'model.w1'")
    with pytest.raises(ValueError, match="KeyError: 'model.w1'"):
        read_reads(path)
    (tmp_path / "bad.json").write_text('{"reads": [["a", 1]]}')
    with pytest.raises(ValueError, match="not a reads file"):
        read_reads(str(tmp_path / "bad.json"))
