"""Unplanned failures: attribution from node reports, the nodes of the next attempt, the restart loop
in the batch shell (with stand-ins for srun and scontrol; the real ones run in tests/e2e/test_recovery.py)."""

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.doctor import DoctorExpectations, Finding
from slurm_titan.doctor.checks import node_findings
from slurm_titan.doctor.facts import NodeFacts
from slurm_titan.doctor.npu_smi import parse_npu_smi_info
from slurm_titan.errors import ExitCode
from slurm_titan.node.batch import ahead, allocation, attribution, finish, step_watch
from slurm_titan.node.batch.outcome import RESTART, STOP, Outcome
from slurm_titan.node.supervisor import rendezvous
from slurm_titan.records import history, ledger, run_folder
from tests.support.batch_specs import SPEC, write_batch_spec
from tests.support.paths import DATA
from tests.support.reports import node_report


def test_the_rank_that_died_first_is_blamed_not_its_peers(tmp_path: Path) -> None:
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 100.4})  # a collective error after
    node_report(tmp_path, 0, 1, "n2", 137, {"rank": 1, "exit_code": -9, "time": 100.1})
    failure = attribution.first_failure(attribution.read_reports(tmp_path, 0, 2), ["n1", "n2"], set())
    assert failure == attribution.NodeFailure("n2", attribution.CRASHED, 1, -9)
    assert failure.describe() == "crashed on n2 rank 1 with SIGKILL"


@pytest.mark.parametrize("skew", [-5.0, 0.0, 5.0])
def test_a_crash_that_shows_a_peers_symptom_comes_after_the_one_that_does_not_whatever_the_clocks(
        tmp_path: Path, skew: float) -> None:
    """n2's rank was killed (its log shows nothing); n1's rank died on the closed connection. With n1's clock 5 s
    behind, its crash looks earlier by the wall clocks; by the logs it is the consequence."""
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 100.3 + skew})
    node_report(tmp_path, 0, 1, "n2", 137, {"rank": 1, "exit_code": -9, "time": 100.1})
    logs = run_folder.rank_logs_folder(tmp_path)
    logs.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "failure_logs/gloo_closed_by_peer.log", run_folder.rank_log(tmp_path, 0))
    run_folder.rank_log(tmp_path, 1).write_text("[titan] step: 12 loss: 7.1\n")
    reports = attribution.read_reports(tmp_path, 0, 2)
    assert attribution.symptom_nodes(reports, tmp_path) == {0}
    failure = attribution.first_failure(reports, ["n1", "n2"], set(), attribution.symptom_nodes(reports, tmp_path))
    assert failure == attribution.NodeFailure("n2", attribution.CRASHED, 1, -9)


def test_a_silent_node_that_does_not_answer_was_lost_and_comes_first(tmp_path: Path) -> None:
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 100.4})  # its peer vanished
    reports = attribution.read_reports(tmp_path, 0, 2)
    assert attribution.silent_nodes(reports, ["n1", "n2"]) == ["n2"]
    assert attribution.first_failure(reports, ["n1", "n2"], {"n2"}).describe() == "node n2 lost"
    # silent but answering: killed by srun after n1's failure, which is the one to blame
    assert attribution.first_failure(reports, ["n1", "n2"], set()).describe() == "crashed on n1 rank 0 with exit code 1"


@pytest.mark.parametrize(("code", "text"), [(-9, "SIGKILL"), (137, "SIGKILL"), (143, "SIGTERM"), (1, "exit code 1"),
                                            (None, "no exit code")])
def test_exit_descriptions(code: int | None, text: str) -> None:
    assert attribution.exit_description(code) == text


def test_exclusion_policy() -> None:
    crash = attribution.NodeFailure("n2", attribution.CRASHED, 1, -9)
    assert attribution.exclusion_reason(crash, spare_left=False, earlier_culprits=[]) is None  # retry in place
    assert "spare" in attribution.exclusion_reason(crash, spare_left=True, earlier_culprits=[])
    assert "failed again" in attribution.exclusion_reason(crash, spare_left=False, earlier_culprits=["n2"])
    lost = attribution.NodeFailure("n3", attribution.LOST)
    assert attribution.exclusion_reason(lost, spare_left=False, earlier_culprits=[]) == "lost"


def busy_verdict(rank: int, info: str = "info_910b3_busy.txt", **changes: object) -> list[Finding]:
    """Node `rank`'s preflight findings from an npu-smi recording (a healthy 910B3 node otherwise)."""
    facts = NodeFacts(rank, f"n{rank + 1}", "npu", {"torch": "2.14.0", "torch_npu": "2.14.0"},
                      npu_smi=parse_npu_smi_info((DATA / "npu-smi" / info).read_text()), cann_version="9.2.0",
                      davinci=[f"davinci{i}" for i in range(8)], device_count=8)
    return node_findings(replace(facts, **changes), DoctorExpectations(device="npu", devices_per_node=8))


def test_a_chip_still_held_after_a_restart_is_blamed_and_retried() -> None:
    verdict = busy_verdict(0, "info_910b3_a2.txt") + busy_verdict(1)
    failure = attribution.preflight_failure(verdict, ["n1", "n2"], attempt=1)
    assert failure is not None and failure.describe() == (
        "preflight failed on n2 (chip busy: NPU 2 chip 0 (910B3): 60741/65536 MB HBM in use; held by pid 48211 "
        "(python3, 57388 MB))")
    assert attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=["n1"]) is None  # retry in place
    assert attribution.exclusion_reason(failure, spare_left=False, earlier_culprits=["n2"]).startswith("failed again")
    assert attribution.preflight_failure(verdict, ["n1", "n2"], attempt=0) is None  # no rank of ours was killed
    assert attribution.preflight_failure(None, ["n1", "n2"], attempt=1) is None  # no verdict: not known transient
    lasting = verdict + busy_verdict(0, "info_910b3_a2.txt", cann_version="8.3.RC1")
    assert attribution.preflight_failure(lasting, ["n1", "n2"], attempt=1) is None


def test_a_node_failing_the_preflight_twice_is_left_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(finish, "_unhealthy", lambda hosts: set())
    recorded: list[tuple[str, bool]] = []
    monkeypatch.setattr(finish.ledger, "record_failure", lambda node, job, kind, cause, excluded, env:
                        recorded.append((node, excluded)))
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"}
    outcomes = []
    for attempt in (0, 1, 2):
        for node in (0, 1):
            node_report(tmp_path, attempt, node, f"n{node + 1}", ExitCode.PREFLIGHT, None)
        folder = run_folder.doctor_folder(tmp_path, attempt)
        folder.mkdir(parents=True)
        findings = busy_verdict(0, "info_910b3_a2.txt") + busy_verdict(1)
        (folder / "verdict.json").write_text(json.dumps({"nodes": 2, "findings": [asdict(f) for f in findings]}))
        outcome, code = finish.conclude(tmp_path, "42", finish.Attempt(attempt, ["n1", "n2"]), 78, SPEC, env)
        outcomes.append((outcome.reason, outcome.action, code))
    assert outcomes == [("preflight failed", STOP, 78), ("failed", RESTART, 78), ("failed", RESTART, 78)]
    attempts = history.read_attempts(tmp_path)
    assert [(a.culprit, a.excluded) for a in attempts] == [(None, []), ("n2", []), ("n2", ["n2"])]
    assert recorded == [("n2", False), ("n2", True)] and allocation.read_excluded(tmp_path) == {
        "n2": "failed again (" + attempts[2].cause + ")"}


def test_nodes_of_the_next_attempt(tmp_path: Path) -> None:
    allocated = ["n1", "n2", "n3", "n4"]
    assert allocation.choose_nodes(allocated, 2, set(), set()) == ["n1", "n2"]
    assert allocation.choose_nodes(allocated, 2, {"n1"}, {"n3"}) == ["n2", "n4"]
    assert allocation.choose_nodes(allocated, 3, {"n1"}, {"n3"}) == ["n2", "n4"]  # too few: the caller requeues
    assert [allocation.next_attempt_number(tmp_path) for _ in range(3)] == [0, 1, 2]


def test_excluded_nodes_survive_and_a_corrupt_file_is_one_warning(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    allocation.exclude(tmp_path, "n2", "lost")
    assert allocation.exclude(tmp_path, "n3", "failed again") == {"n2": "lost", "n3": "failed again"}
    run_folder.excluded_nodes_file(tmp_path).write_text("{not json")
    assert allocation.read_excluded(tmp_path) == {}
    assert "is unreadable" in capsys.readouterr().err


def test_rendezvous_follows_the_attempts_nodes() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "3",
           envvars.NODES: "n2,n4", "SLURMD_NODENAME": "n4"}
    rdzv = rendezvous.from_slurm_env(env, 2)
    assert (rdzv.master_addr, rdzv.node_rank, rdzv.world_size) == ("n2", 1, 4)
    with pytest.raises(rendezvous.RendezvousError, match="SLURMD_NODENAME=n3 is not one of"):
        rendezvous.from_slurm_env(env | {"SLURMD_NODENAME": "n3"}, 2)


def test_history_counts_stalled_failures_and_retrained_steps(tmp_path: Path) -> None:
    for number, (first, trained, progressed) in enumerate([(1, 12, True), (11, 12, False), (11, 12, False)]):
        history.append_event(tmp_path, "start", number, hosts=["n1"])
        history.append_event(tmp_path, "first-step", number, step=first)
        history.append_event(tmp_path, "end", number, exit_code=1, reason="failed", trained_step=trained,
                             progressed=progressed, cause="crashed on n1 rank 0 with exit code 1", culprit="n1")
    attempts = history.read_attempts(tmp_path)
    assert history.stalled_failures(attempts) == 2
    assert history.stalled_failures(attempts[:1]) == 0
    rows = history.as_dicts(attempts)
    assert [row.get("steps_retrained") for row in rows] == [2, 2, None]  # steps 11 and 12 trained again
    assert rows[0]["cause"] == "crashed on n1 rank 0 with exit code 1" and rows[0]["culprit"] == "n1"


def _stand_ins(folder: Path, fail_attempts: set[int]) -> None:
    """`srun` that writes node reports for SLURM_TITAN_ATTEMPT_INDEX (a crash on the first node for the
    attempts in `fail_attempts`, else success), and `scontrol` that knows every node as idle."""
    fail = " ".join(str(a) for a in sorted(fail_attempts)) or "none"
    (folder / "srun").write_text(f"""#!/bin/sh
a=$SLURM_TITAN_ATTEMPT_INDEX; d=$JOB_DIR/attempts/$a; mkdir -p $d
echo "$SLURM_TITAN_NODES" > $d/nodes
first=${{SLURM_TITAN_NODES%%,*}}
case " {fail} " in *" $a "*) f='{{"rank": 0, "exit_code": -9, "time": 1}}'; c=137;; *) f=null; c=0;; esac
echo "{{\\"host\\": \\"$first\\", \\"exit_code\\": $c, \\"ranks\\": {{}}, \\"first_failure\\": $f}}" > $d/node-0.json
echo "{{\\"host\\": \\"x\\", \\"exit_code\\": 0, \\"ranks\\": {{}}, \\"first_failure\\": null}}" > $d/node-1.json
echo $((a + 20)) > $d/trained-step
exit $c
""")
    (folder / "scontrol").write_text("#!/bin/sh\n[ \"$2\" = node ] && for n in n1 n2 n3; do "
                                     "echo \"NodeName=$n State=IDLE\"; done\nexit 0\n")
    for name in ("srun", "scontrol"):
        (folder / name).chmod(0o755)


def _failed_attempt_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail_attempts: set[int]) -> Path:
    """A job folder whose attempt 0 on n1,n2 of the allocation n1..n3 just failed (n1's rank killed first),
    with stand-ins for srun and scontrol on PATH and the batch shell's environment set."""
    job_dir, bin_dir = tmp_path / "job", tmp_path / "bin"
    job_dir.mkdir(), bin_dir.mkdir()
    _stand_ins(bin_dir, fail_attempts)
    (job_dir / "42_submission.sh").write_text("#!/bin/bash\n# command\nsrun --nodes=$SLURM_TITAN_NUM_NODES bash -c '\n"
                                              "true'\n\n# teardown\nexit_code=$?\n")
    node_report(job_dir, 0, 0, "n1", 137, {"rank": 0, "exit_code": -9, "time": 5.0})
    node_report(job_dir, 0, 1, "n2", 1, {"rank": 1, "exit_code": 1, "time": 6.0})
    run_folder.trained_step_file(job_dir, 0).write_text("12")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("JOB_DIR", str(job_dir))
    for name, value in {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", envvars.ATTEMPT_INDEX: "0",
                        envvars.NODES: "n1,n2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(finish.slurm, "time_left_seconds", lambda job_id: 3600)
    return job_dir


def _finish(job_dir: Path, **changes: object) -> int:
    """finish after attempt 0 on 2 nodes, max_requeues and max_failures 5, a 60 s warning window, with `changes`."""
    write_batch_spec(job_dir, **changes)
    return finish.main(["--job-dir", str(job_dir), "--srun-exit-code", "137"])


def test_a_crash_restarts_inside_the_allocation_on_the_spare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts={1})
    assert _finish(job_dir) == 0
    attempts = history.read_attempts(job_dir)
    assert [(a.attempt, a.reason, a.action) for a in attempts] == [(0, "failed", "restart"), (1, "failed", "restart"),
                                                                    (2, "finished", "stop")]
    assert attempts[0].cause == "crashed on n1 rank 0 with SIGKILL" and attempts[0].excluded == ["n1"]
    assert (job_dir / "attempts/1/nodes").read_text().strip() == "n2,n3"  # the spare took n1's place
    # n2 fails next, with no spare left: it is kept (a first failure), and the run goes on on n2,n3
    assert attempts[1].excluded == [] and (job_dir / "attempts/2/nodes").read_text().strip() == "n2,n3"


@pytest.mark.parametrize("trained_since", [True, False])
def test_a_node_failing_again_without_a_spare_is_left_out_only_when_the_run_made_no_progress_since(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, trained_since: bool) -> None:
    """n1 was blamed in attempt 0 (step 12 trained) and is blamed again in attempt 1, no spare: kept when attempt 1
    trained beyond step 12 (its failures came with training between them: leaving it out would requeue the job),
    left out (the job requeued without it) when it did not (it fails every time)."""
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts={1})
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")  # no spare
    requeued: list[str] = []
    monkeypatch.setattr(finish, "requeue_job", lambda job_dir, job_id, attempt: requeued.append(job_id) or 0)
    if not trained_since:  # the stand-in srun writes step attempt + 20 as the attempt's trained step
        (tmp_path / "bin" / "srun").write_text((tmp_path / "bin" / "srun").read_text().replace(
            "echo $((a + 20))", "echo 12"))
    assert _finish(job_dir) == 0
    attempts = history.read_attempts(job_dir)
    assert attempts[0].excluded == [] and attempts[1].culprit == "n1"
    if trained_since:
        assert attempts[1].excluded == [] and [a.reason for a in attempts] == ["failed", "failed", "finished"]
        assert requeued == []
    else:
        assert attempts[1].excluded == ["n1"] and "failed again" in allocation.read_excluded(job_dir)["n1"]
        assert requeued == ["42"]


def _started_ahead(job_dir: Path, tmp_path: Path, nodes: tuple[str, ...]) -> None:
    """Attempt 0's failure started attempt 1's step ahead on `nodes`: an srun that waits for its word, then does what
    the stand-in srun does (on go) or exits 3."""
    waiting = tmp_path / "ahead-bin"
    waiting.mkdir()
    (waiting / "srun").write_text(f"""#!/bin/sh
word=$JOB_DIR/attempts/$SLURM_TITAN_ATTEMPT_INDEX/{run_folder.AHEAD_WORD}
for i in $(seq 200); do
  grep -q true $word 2>/dev/null && exec {tmp_path / "bin" / "srun"} "$@"
  grep -q false $word 2>/dev/null && exit 3
  sleep 0.05
done
exit 4
""")
    (waiting / "srun").chmod(0o755)
    ahead.start_ahead(job_dir, "42", 0, nodes, dict(os.environ, PATH=f"{waiting}:{os.environ['PATH']}"))


def test_a_restart_on_the_nodes_of_the_step_started_ahead_runs_in_it(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts=set())
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")  # no spare: n1 stays (a first failure)
    _started_ahead(job_dir, tmp_path, ("n1", "n2"))
    assert _finish(job_dir) == 0
    assert [(a.attempt, a.reason) for a in history.read_attempts(job_dir)] == [(0, "failed"), (1, "finished")]
    assert json.loads((job_dir / "attempts/1" / run_folder.AHEAD_WORD).read_text()) == {"go": True}
    assert (job_dir / "attempts/0" / run_folder.AHEAD_EXIT).read_text() == "0"  # it ran attempt 1, to its end


def test_a_restart_on_other_nodes_ends_the_step_started_ahead_and_numbers_its_own(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Path) -> None:
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts=set())
    _started_ahead(job_dir, tmp_path, ("n1", "n2"))  # attempt 1 claimed
    assert _finish(job_dir) == 0  # n1 swapped for the spare n3
    assert [(a.attempt, a.reason) for a in history.read_attempts(job_dir)] == [(0, "failed"), (2, "finished")]
    assert json.loads((job_dir / "attempts/1" / run_folder.AHEAD_WORD).read_text()) == {"go": False}
    assert (job_dir / "attempts/2/nodes").read_text().strip() == "n2,n3"
    deadline = time.monotonic() + 10
    while not (job_dir / "attempts/0" / run_folder.AHEAD_EXIT).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (job_dir / "attempts/0" / run_folder.AHEAD_EXIT).read_text() in ("3", "-9")


def test_a_peer_memory_fault_leaves_the_named_peer_out_not_the_node_that_saw_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """n1's rank 0 died first on a 507055 whose HCCL report names n2's address: n2 is left out and goes into
    the node ledger as a hardware fault; n1 stays (in the next attempt, with the spare n3)."""
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts=set())
    run_folder.rank_logs_folder(job_dir).mkdir()
    run_folder.rank_log(job_dir, 0).write_text((DATA / "failure_logs/suspect_mem_507055.log").read_text())
    monkeypatch.setattr(attribution.socket, "getaddrinfo",
                        lambda host, port: [(0, 0, 0, "", ({"n2": "10.20.0.12"}.get(host, "10.0.0.1"), 0))])
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    assert _finish(job_dir) == 0
    first = history.read_attempts(job_dir)[0]
    assert first.excluded == ["n2"] and first.culprit == "n2"
    assert (job_dir / "attempts/1/nodes").read_text().strip() == "n1,n3"
    [recorded] = ledger.read(tmp_path / "home/nodes/c.jsonl")
    assert (recorded.node, recorded.kind, recorded.excluded) == ("n2", "hardware", True)


def test_the_step_of_a_lost_node_is_ended_not_waited_for_and_blamed_without_a_second_probe(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "60"])  # stands for an srun waiting on a dead node
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 1.0})
    probed: list[list[str]] = []

    def probe(hosts: list[str]) -> set[str]:
        probed.append(hosts)
        return {"n2"}

    assert step_watch.watch(tmp_path, 0, ["n1", "n2"], srun.pid, grace_s=0.2, poll_s=0.05, probe=probe) == ["n2"]
    assert srun.wait(timeout=10) == -9 and probed == [["n2"]]
    monkeypatch.setattr(finish, "probe_failures", probe)
    monkeypatch.setattr(finish, "_unhealthy", lambda hosts: set())  # Slurm has not marked n2 down yet
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TITAN_HOME": str(tmp_path / "home"), "SLURM_CLUSTER_NAME": "c"}
    failure, _ = finish.blame(tmp_path, "42", finish.Attempt(0, ["n1", "n2"]), Outcome("failed", RESTART), env,
                              attribution.read_reports(tmp_path, 0, 2), progressed=True)
    assert failure is not None and failure.describe() == "node n2 lost" and probed == [["n2"]]  # the watcher's round


def test_nodes_lost_together_are_all_named_left_out_and_recorded(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    # A node and its RAM-tier partner lost at once: both are blamed, not the first one only (the next attempt
    # must not be offered the other one again once its slurmd answers)
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 1.0})
    monkeypatch.setattr(finish, "_unhealthy", lambda hosts: {"n2", "n3"})
    monkeypatch.setattr(step_watch, "found_lost", lambda job_dir, attempt: None)
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    env = {"SLURM_JOB_NODELIST": "n[1-5]", "SLURM_TITAN_HOME": str(tmp_path / "home"), "SLURM_CLUSTER_NAME": "c"}
    failure, excluded = finish.blame(tmp_path, "42", finish.Attempt(0, ["n1", "n2", "n3"]),
                                     Outcome("failed", RESTART), env, attribution.read_reports(tmp_path, 0, 3),
                                     progressed=True)
    assert failure is not None and failure.describe() == "nodes n2, n3 lost" and excluded == ["n2", "n3"]
    assert allocation.read_excluded(tmp_path) == {"n2": "lost", "n3": "lost"}
    assert [(e.node, e.kind, e.excluded) for e in ledger.read(tmp_path / "home/nodes/c.jsonl")] == [
        ("n2", "unknown", True), ("n3", "unknown", True)]


def test_a_slow_but_answering_node_is_not_cut_short(tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "1.5"])
    node_report(tmp_path, 0, 0, "n1", 0, None)  # n2 still uploading its last checkpoint
    probed: list[list[str]] = []
    assert step_watch.watch(tmp_path, 0, ["n1", "n2"], srun.pid, grace_s=0.2, poll_s=0.05,
                            probe=lambda hosts: probed.append(hosts) or set()) == []
    assert srun.wait(timeout=10) == 0
    # probed again only after twice the wait each time (0.2, 0.4, 0.8 s): at most 3 rounds in 1.5 s, not 7
    assert 1 <= len(probed) <= 3 and all(hosts == ["n2"] for hosts in probed)
    assert run_folder.batch_shell_beat(tmp_path, 0).is_file()  # beaten all along, from its own thread


def test_the_watcher_sights_each_report_on_its_own_clock(tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "1.0"])
    node_report(tmp_path, 0, 0, "n1", 1, {"rank": 0, "exit_code": 1, "time": 1.0})
    started = time.time()
    threading.Timer(0.5, node_report, (tmp_path, 0, 1, "n2", 1, None)).start()  # while the watcher waits on srun
    assert step_watch.watch(tmp_path, 0, ["n1", "n2"], srun.pid, grace_s=5, poll_s=0.05, probe=lambda _: set()) == []
    seen = attribution.read_sightings(tmp_path, 0)
    assert list(seen) == [1] and 0.5 <= seen[1] - started < 0.5 + 0.4  # seen within a 0.2 s listing of its write
    # n1's report was there before the watcher first looked: when it came is unknown, so it is not sighted (and
    # the nodes' own clocks order this attempt's failures)


def test_the_watcher_beats_as_it_sights_a_report_and_hears_sruns_end_at_once(tmp_path: Path) -> None:
    # a 30 s period: the beat after the report is the sighting's, and the watch ends as srun does (its pidfd), not
    # at its next poll; the failed node's supervisor exits once it sees a beat after its failure
    srun = subprocess.Popen(["sleep", "1.0"])
    wrote: list[float] = []

    def report() -> None:
        node_report(tmp_path, 0, 1, "n2", 1, {"rank": 1, "exit_code": -9, "time": 1.0})
        wrote.append(run_folder.node_report(tmp_path, 0, 1).stat().st_mtime)

    threading.Timer(0.5, report).start()
    assert step_watch.watch(tmp_path, 0, ["n1", "n2"], srun.pid, grace_s=5, poll_s=30, probe=lambda _: set()) == []
    assert srun.poll() is not None
    assert wrote and run_folder.batch_shell_beat(tmp_path, 0).stat().st_mtime >= wrote[0]


def test_shrink_counts_follow_the_parallelism(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from slurm_titan.launch.config import load_config
    from slurm_titan.launch.plan import shrink_node_counts

    def counts(*sets: tuple[str, object]) -> list[int]:
        return shrink_node_counts(load_config("configs/debug_cpu.yaml", [("slurm.nodes", 4), *sets]))

    assert counts() == []  # off by default: too few nodes means a requeue
    assert counts(("preemption.allow_shrink", True)) == [3, 2, 1]
    assert counts(("preemption.allow_shrink", True), ("preemption.min_nodes", 2)) == [3, 2]
    tp2 = ("torchtitan.args.parallelism.tensor_parallel_degree", 2)
    assert counts(("preemption.allow_shrink", True), tp2) == [2]  # world sizes 3 and 1 cannot hold tp 2
    assert "shrinking stops at 2 node(s)" in capsys.readouterr().err  # min_nodes defaults to 1


def test_a_run_with_too_few_nodes_left_goes_on_with_fewer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job_dir = _failed_attempt_0(monkeypatch, tmp_path, fail_attempts=set())
    allocation.exclude(job_dir, "n3", "lost")  # the spare is gone already
    history.append_event(job_dir, "end", -1, reason="failed", culprit="n1", progressed=True,
                         trained_step=12)  # n1 failed before, at the step attempt 0 failed at too: no progress since
    assert _finish(job_dir, shrink_to=(1,)) == 0
    assert (job_dir / "attempts/1/nodes").read_text().strip() == "n2"  # n1 failed again: left out; n2 goes on alone


@pytest.mark.parametrize(("shown", "lost"), [
    ("JobId=7 JobState=RUNNING NodeList=n2 BatchHost=n1", "n1"),  # Slurm removed the batch host (--no-kill)
    ("JobId=7 JobState=RUNNING NodeList=n[1-2] BatchHost=n1", None),
    ("JobId=7 JobState=PENDING NodeList=n2 BatchHost=n1", None),  # requeued already
])
def test_a_job_without_its_batch_host_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shown: str,
                                               lost: str | None) -> None:
    from slurm_titan.node.supervisor import batch_host

    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho '{shown}'\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert batch_host.lost_batch_host("7") == lost
