"""The failure-kind classifier on recorded rank-log lines (tests/data/failure_logs/README.md names sources),
and the attribution's use of it: the kind in the cause, a hardware fault leaves the node out, a peer's fault
the peer's node (or none), a fault to retry none."""

from pathlib import Path

import pytest

from slurm_titan import failure_kinds
from slurm_titan.failure_kinds import HARDWARE, NETWORK, OOM, PEER, RETRY, UNKNOWN, USER
from slurm_titan.node.batch import attribution
from slurm_titan.records import run_folder
from tests.support.paths import DATA

LOGS = DATA / "failure_logs"


@pytest.mark.parametrize("name,kind,evidence", [
    ("uce_error_507053.log", HARDWARE, "UCE  ERROR, error code is 507053"),
    ("hbm_ecc_507054.log", HARDWARE, "HBM MULTI BIT ECC ERROR."),
    ("suspect_mem_507055.log", PEER, "SUSPECT MEM ERROR, error code is 507055"),
    ("hccs_link_507056.log", RETRY, "HCCS LINK ERROR"),
    ("ts_heartbeat_507010.log", HARDWARE, "error code is 507010"),
    ("ei0006_socket_timeout.log", NETWORK, "EI0006: [PID: 1292363]"),
    ("ei0002_heartbeat_lost.log", NETWORK, "Heartbeat Lost Occurred]"),
    ("vector_core_507035.log", UNKNOWN, "error code is 507035"),
    ("gloo_closed_by_peer.log", NETWORK, "Connection closed by peer [18.25.6.30]:28048"),
    ("gloo_reset_by_peer.log", NETWORK, "Connection reset by peer"),
    ("nccl_ib_completion_error.log", NETWORK, "NCCL WARN NET/IB : Got completion with error 12"),
    ("npu_out_of_memory.log", OOM, "NPU out of memory. Tried to allocate 5.03 GiB"),
    ("kernel_oom_killer.log", OOM, "Out of memory: Killed process 7899 (python)"),
    ("slurm_oom_kill.log", OOM, "task 0: Out Of Memory"),
    ("slurm_oom_kill_old.log", OOM, "oom-kill event(s) in StepId=191.batch"),
    ("python_key_error.log", USER, "KeyError: 'RANK'"),
])
def test_recorded_lines_are_classified(name: str, kind: str, evidence: str) -> None:
    verdict = failure_kinds.classify_log(LOGS / name)
    assert verdict.kind == kind
    assert verdict.line is not None and verdict.line.startswith(evidence)
    assert verdict.peer == ("10.20.0.12" if kind == PEER else None)  # ei0002's report names a device: no peer fault


def test_every_recording_is_tested_and_named_in_the_readme() -> None:
    readme = (LOGS / "README.md").read_text()
    assert all(f"`{path.name}`" in readme for path in LOGS.glob("*.log"))


def test_hardware_wins_over_the_traceback_and_the_peers_symptoms() -> None:
    lines = ["Traceback (most recent call last):", "EI0006: Getting socket times out.",
             "RuntimeError: x NPU function error: HBM MULTI BIT ECC ERROR.time is 1, error code is 507054",
             "[rank0]: RuntimeError: [pair.cc:534] Connection closed by peer [10.0.0.2]:1"]
    assert failure_kinds.classify_lines(lines) == (HARDWARE, "HBM MULTI BIT ECC ERROR.time is 1, error code is 507054",
                                                   None)


def test_the_last_line_of_the_winning_kind_is_the_evidence() -> None:
    lines = ["ValueError: first", "step 3", "KeyError: 'last'"]
    assert failure_kinds.classify_lines(lines) == (USER, "KeyError: 'last'", None)


def test_a_log_without_signature_or_file_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "quiet.log").write_text("step 1 loss 3.2\nstep 2 loss 3.1\n")
    assert failure_kinds.classify_log(tmp_path / "quiet.log") == failure_kinds.NO_EVIDENCE
    assert failure_kinds.classify_log(tmp_path / "missing.log") == failure_kinds.NO_EVIDENCE


def test_only_the_tail_is_read_and_its_cut_first_line_dropped(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_bytes(b"KeyError: 'early'\n" + b"x" * 5000 + b" UCE ERROR cut\n" + b"step 9\n")
    assert failure_kinds.read_tail(log, limit=100) == ["step 9"]
    assert failure_kinds.classify_log(log, limit=100) == failure_kinds.NO_EVIDENCE
    assert failure_kinds.classify_log(log).kind == HARDWARE


def test_classify_rank_logs_prefers_the_most_telling_rank(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.log").write_text("KeyError: 'x'\n")
    (logs / "rank-1.log").write_text("RuntimeError: copy failed, UCE ERROR, error code is 507053\n")
    assert failure_kinds.classify_logs([run_folder.rank_log(tmp_path, r) for r in (0, 1)]).kind == HARDWARE
    assert failure_kinds.classify_logs([run_folder.rank_log(tmp_path, 0)]).kind == USER
    assert failure_kinds.classify_logs([run_folder.rank_log(tmp_path, 7)]) == failure_kinds.NO_EVIDENCE


HOSTS = ["n1", "n2", "n3"]
ADDRESSES = {"n1": {"10.20.0.10"}, "n2": {"10.20.0.11"}, "n3": {"10.20.0.12"}}


def _crash_with_log(tmp_path: Path, text: str) -> attribution.NodeFailure:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-1.log").write_text(text)
    return attribution.classified(attribution.NodeFailure("n2", attribution.CRASHED, 1, -9), tmp_path, HOSTS,
                                  resolve=lambda host: ADDRESSES[host])


def test_the_cause_names_the_kind_and_line_and_hardware_leaves_the_node_out(tmp_path: Path) -> None:
    failure = _crash_with_log(tmp_path, "step 3\nRuntimeError: f NPU function error: HBM MULTI BIT ECC ERROR.\n")
    assert failure.describe() == "crashed on n2 rank 1 with SIGKILL (hardware: 'HBM MULTI BIT ECC ERROR.')"
    assert attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=[]) == \
        f"hardware fault ({failure.describe()})"


def test_a_peer_symptom_does_not_leave_the_node_out(tmp_path: Path) -> None:
    failure = _crash_with_log(tmp_path, "EI0006: Getting socket times out. Reason: Remote Rank did not send\n")
    assert failure.fault == NETWORK
    assert attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=[]) is None


def test_an_unclassified_crash_reads_as_before(tmp_path: Path) -> None:
    failure = _crash_with_log(tmp_path, "step 3\n")
    assert (failure.fault, failure.describe()) == (UNKNOWN, "crashed on n2 rank 1 with SIGKILL")
    lost = attribution.classified(attribution.NodeFailure("n3", attribution.LOST), tmp_path, HOSTS)
    assert (lost.fault, lost.describe()) == (UNKNOWN, "node n3 lost")


def test_a_suspect_mem_error_blames_the_peer_it_names_not_the_node_that_saw_it(tmp_path: Path) -> None:
    """507055: the faulty memory is the peer device's (CANN's table); HCCL's report names it at 10.20.0.12 (n3)."""
    failure = _crash_with_log(tmp_path, (LOGS / "suspect_mem_507055.log").read_text())
    assert (failure.fault, failure.peer, failure.blamed()) == (PEER, "n3", ("n3", HARDWARE))
    assert failure.describe().endswith(", the faulty memory on peer node n3")
    assert attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=[]) == \
        f"hardware fault seen by a peer ({failure.describe()})"


@pytest.mark.parametrize("tail", [
    "RuntimeError: Run:NPUQueue.cpp:236 NPU function error: SUSPECT MEM ERROR, error code is 507055\n",
    (LOGS / "suspect_mem_507055.log").read_text().replace("10.20.0.12", "10.99.0.1"),  # no node of the attempt
])
def test_a_suspect_mem_error_naming_no_peer_of_the_attempt_leaves_nothing_out(tmp_path: Path, tail: str) -> None:
    failure = _crash_with_log(tmp_path, tail)
    assert (failure.fault, failure.peer, failure.blamed()) == (PEER, None, ("n2", PEER))
    assert attribution.exclusion_reason(failure, spare_left=True, earlier_culprits=[]) is None


def test_a_link_error_is_retried_on_the_same_node_even_with_a_spare(tmp_path: Path) -> None:
    """507056: CANN's table says retry; a node whose link fails again in the run is left out."""
    failure = _crash_with_log(tmp_path, (LOGS / "hccs_link_507056.log").read_text())
    assert failure.blamed() == ("n2", RETRY)
    assert attribution.exclusion_reason(failure, spare_left=True, earlier_culprits=[]) is None
    assert "failed again" in attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=["n2"])


def test_the_peer_is_found_by_name_or_address() -> None:
    resolve = ADDRESSES.__getitem__
    assert attribution.peer_host("n3", HOSTS, resolve) == "n3"
    assert attribution.peer_host("10.20.0.11", HOSTS, resolve) == "n2"
    assert attribution.peer_host("10.20.0.99", HOSTS, resolve) is None
    assert attribution.host_addresses("no-such-host.invalid") == set()
