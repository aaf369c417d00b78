import pytest

from slurm_titan.hostlist import expand_hostlist


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3,7],a-[01-02]", ["n1", "n2", "n3", "n7", "a-01", "a-02"]),
        ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node-a,node-b", ["node-a", "node-b"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
    ],
)
def test_expands_like_scontrol_show_hostnames(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", ""])
def test_bad_hostlist_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)
