"""Slow nodes: the judge's scores and verdicts, whether a swap pays, the batch shell's records and its action
(the real throttled processes: tests/integration/node/test_throttled_node.py; on the cluster:
tests/e2e/test_slow_node.py)."""

import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_titan import envvars
from slurm_titan.errors import ExitCode
from slurm_titan.node.batch import finish, step_watch
from slurm_titan.node.batch.outcome import RESTART, SLOW_NODE, RunSoFar, decide
from slurm_titan.node.batch.slow_watch import SlowNodeWatch
from slurm_titan.node.batch.straggler import Judge, choose_action, swap_cost_s
from slurm_titan.node.batch_spec import BatchSpec, RetryPolicy
from slurm_titan.node.straggler_config import StragglerPlan
from slurm_titan.records import history, ledger, node_timing, run_folder, slow_nodes
from slurm_titan.records.node_timing import NodeTiming
from slurm_titan.records.slow_nodes import ALERT, DEVICE, HOST, SWAP, SlowNode
from tests.support.batch_specs import SPEC, write_batch_spec
from tests.support.reports import node_report

HOSTS = ["n1", "n2", "n3"]


class Cluster:
    """Synchronous training as the nodes' timing files tell it: every node trains the same steps; node i works
    `work[i]` s per step (its wanted CPU time), and the step takes as long as the slowest node's work. With
    `chip`, node i's chip probe takes `chip[i]` s of device time at every step (an accelerator's nodes)."""

    def __init__(self, work: list[float], noise: float = 0.0, seed: int = 0, chip: list[float] | None = None) -> None:
        self.work, self.noise, self.rng, self.chip = list(work), noise, random.Random(seed), chip
        self.step, self.now = 1, 1000.0
        self.sums = [[0, 0.0, 0.0] for _ in work]  # steps, work_s, wall_s
        self.device = [0.0 for _ in work]

    def run(self, steps: int) -> dict[int, NodeTiming]:
        for _ in range(steps):
            spent = [w * (1 + self.rng.uniform(-self.noise, self.noise)) for w in self.work]
            wall = max(spent)
            for node, w in enumerate(spent):
                self.sums[node][0] += 1
                self.sums[node][1] += w
                self.sums[node][2] += wall
                if self.chip:
                    self.device[node] += self.chip[node] * (1 + self.rng.uniform(-self.noise, self.noise))
            self.step, self.now = self.step + 1, self.now + wall
        return self.timings()

    def timings(self) -> dict[int, NodeTiming]:
        return {node: NodeTiming(node=node, host=HOSTS[node], time=self.now, step=self.step, steps=steps,
                                 work_s=work, wall_s=wall, device_s=self.device[node],
                                 probes=steps if self.chip else 0)
                for node, (steps, work, wall) in enumerate(self.sums)}


def judge(window: int | None = 20, threshold: float = 0.8, warmup: int = 5, hosts: int = 3) -> Judge:
    return Judge(attempt=0, hosts=HOSTS[:hosts], threshold=threshold, window_steps=window, warmup_steps=warmup)


def run_until_named(j: Judge, cluster: Cluster, chunks: int, per_chunk: int = 4):
    lines, named = [], []
    for _ in range(chunks):
        line, candidate = j.offer(cluster.run(per_chunk), cluster.now)
        lines += [line] if line else []
        named += [candidate] if candidate else []
    return lines, named


def test_a_node_working_1_5x_as_long_is_named_after_the_window_once() -> None:
    j, cluster = judge(window=20), Cluster([1.0, 1.5, 1.0], noise=0.05)
    lines, named = run_until_named(j, cluster, chunks=30)
    [candidate] = named  # once per attempt, however long it stays slow
    assert candidate.host == "n2" and candidate.score == pytest.approx(1 / 1.5, abs=0.05)
    assert candidate.step - candidate.since_step >= 20
    assert candidate.step_wall_s == pytest.approx(1.5, abs=0.1)
    assert all(line.scores["n1"] > 1.1 for line in lines)  # a healthy node scores above 1 against a slow one


def test_healthy_nodes_with_noise_and_a_slowdown_every_node_shares_name_none() -> None:
    j, cluster = judge(window=10), Cluster([1.0, 1.0, 1.0], noise=0.15, seed=3)
    assert run_until_named(j, cluster, chunks=50)[1] == []
    cluster.work = [2.0, 2.0, 2.0]  # the file system slows every node alike
    assert run_until_named(j, cluster, chunks=50)[1] == []


def test_the_first_steps_are_not_judged_a_short_dip_is_forgiven_and_a_node_slow_most_of_the_time_is_not() -> None:
    j, cluster = judge(window=12, warmup=10), Cluster([1.0, 3.0, 1.0])
    assert j.offer(cluster.run(9), cluster.now) == (None, None)  # the first reading
    assert j.offer(cluster.run(1), cluster.now) == (None, None)  # still warming up (steps 1..10)
    j, cluster = judge(window=12, warmup=0), Cluster([1.0, 1.0, 1.0])
    run_until_named(j, cluster, chunks=3)
    cluster.work[1] = 2.0
    assert run_until_named(j, cluster, chunks=2)[1] == []  # 8 slow steps, under the window
    cluster.work[1] = 1.0
    assert run_until_named(j, cluster, chunks=1)[1] == []  # and over
    cluster.work[1] = 2.0
    [candidate] = run_until_named(j, cluster, chunks=2)[1]  # slow again: 2 chunks of the window's 3, and now
    assert candidate.host == "n2" and candidate.score == pytest.approx(12 / 20)  # its 12 steps: 12 s against 20 s


def test_a_node_steadily_1_3x_slow_is_named_though_noise_lifts_some_chunks_above_the_threshold() -> None:
    cluster = Cluster([1.0, 1.3, 1.0], noise=0.2, seed=5)
    lines, named = run_until_named(judge(window=20), cluster, chunks=40, per_chunk=2)
    assert any(line.scores["n2"] >= 0.8 for line in lines)  # a judge that needed every chunk below would wait
    [candidate] = named
    assert candidate.host == "n2" and candidate.score == pytest.approx(1 / 1.3, abs=0.05)


def test_two_nodes_score_against_each_other_and_1_2x_stays_above_the_default_threshold() -> None:
    lines, named = run_until_named(judge(window=10, hosts=2), Cluster([1.0, 1.25]), chunks=20)
    assert named == [] and lines[-1].scores["n2"] == pytest.approx(0.8)
    assert run_until_named(judge(window=10, threshold=0.9, hosts=2), Cluster([1.0, 1.2]), chunks=20)[1][0].host == "n2"


def test_a_slow_chip_is_named_by_its_probe_where_the_hosts_work_alike() -> None:
    # an accelerator's host only launches kernels and waits: its wanted CPU time is the same on every node
    cluster = Cluster([1.0, 1.0, 1.0], noise=0.05, seed=3, chip=[0.06e-3, 0.06e-3 * 1.5, 0.06e-3])
    lines, named = run_until_named(judge(), cluster, chunks=20)
    [candidate] = named
    assert (candidate.host, candidate.signal) == ("n2", DEVICE)
    assert candidate.score == pytest.approx(1 / 1.5, abs=0.05)
    assert lines[-1].scores["n2"] == pytest.approx(1 / 1.5, abs=0.1)  # a line shows the lower of the two
    # a chip slowdown every node shares, or healthy chips with noise, name none; nor does a node whose probe has
    # not finished (no new probes on one node: the device signal waits, the host's goes on)
    assert run_until_named(judge(), Cluster([1.0] * 3, noise=0.05, chip=[2e-4] * 3), chunks=40)[1] == []
    stalled, j = Cluster([1.0, 1.0, 1.0], chip=[1e-4, 2e-4, 1e-4]), judge(window=4, warmup=0)
    for _ in range(10):
        timings = stalled.run(2)
        timings[1] = replace(timings[1], probes=0, device_s=0.0)
        assert j.offer(timings, stalled.now)[1] is None


def test_a_slow_host_is_still_named_by_its_host_time_on_an_accelerator() -> None:
    [candidate] = run_until_named(judge(), Cluster([1.0, 1.0, 1.5], chip=[1e-4] * 3), chunks=20)[1]
    assert (candidate.host, candidate.signal) == ("n3", HOST)


def test_the_default_window_is_a_minute_of_the_first_judged_steps() -> None:
    j = judge(window=None, warmup=0)
    cluster = Cluster([2.0, 2.0, 3.0])  # 3 s steps: 20 steps
    run_until_named(j, cluster, chunks=2)
    assert j.window == 20
    fast = judge(window=None, warmup=0)
    run_until_named(fast, Cluster([60.0, 60.0, 60.0]), chunks=2)
    assert fast.window == 3  # at least MIN_WINDOW_STEPS


def test_a_node_missing_or_without_a_new_step_waits_and_new_counters_start_over() -> None:
    j, cluster = judge(window=4, warmup=0), Cluster([1.0, 2.0, 1.0])
    timings = cluster.run(3)
    assert j.offer({0: timings[0], 1: timings[1]}, cluster.now) == (None, None)
    j.offer(timings, cluster.now)
    assert j.offer(timings, cluster.now) == (None, None)  # no node finished a step since
    restarted = cluster.run(3) | {1: NodeTiming(node=1, host="n2", time=0, step=7, steps=1, work_s=2.0, wall_s=2.0)}
    assert j.offer(restarted, cluster.now) == (None, None)


def test_a_swap_pays_only_when_the_gain_over_the_time_left_beats_its_cost() -> None:
    common = {"score": 0.6, "step_wall_s": 2.0, "cost_s": 100.0}
    assert choose_action(action=SWAP, spare=True, steps_left=1000, time_left_s=None, **common)[0] == SWAP
    action, why = choose_action(action=SWAP, spare=True, steps_left=100, time_left_s=None, **common)
    assert action == ALERT and "80 s" in why and "100 s" in why  # 100 steps x 2 s x 0.4
    assert choose_action(action=SWAP, spare=True, steps_left=1000, time_left_s=200.0, **common)[0] == ALERT
    assert choose_action(action=SWAP, spare=False, steps_left=1000, time_left_s=None, **common) == (
        ALERT, "no spare node left in the allocation")
    assert choose_action(action=ALERT, spare=True, steps_left=1000, time_left_s=None, **common)[0] == ALERT
    assert choose_action(action=SWAP, spare=True, steps_left=None, time_left_s=None, **common)[0] == SWAP


def test_the_swap_cost_is_the_runs_measured_restart_plus_a_step() -> None:
    first = history.Attempt(0, started=100.0, first_step_time=160.0, ended=500.0)
    assert swap_cost_s([first], 0, 2.0) == 62.0  # this attempt's start-up
    second = history.Attempt(1, started=510.0, first_step_time=545.0)
    assert swap_cost_s([first, second], 1, 2.0) == 47.0  # attempt 0's end to attempt 1's first step
    assert swap_cost_s([history.Attempt(0, started=100.0)], 0, 2.0) is None


def test_a_swap_restarts_without_counting_a_failure() -> None:
    policy = RetryPolicy(max_requeues=5, max_failures=0, max_failures_without_progress=1)
    run = RunSoFar(requeues=0, failures=0, stalled_failures=0, progressed=False)
    outcome = decide(ExitCode.PREEMPTED, False, run, policy, swapping=True)
    assert (outcome.reason, outcome.action) == (SLOW_NODE, RESTART)  # max_failures=0 does not stop it
    assert decide(ExitCode.PREEMPTED, True, run, policy, swapping=True).reason == "timed out"
    assert decide(1, False, run, policy, swapping=True).reason == "failed"  # a crash stays a crash


def _plan(action: str = SWAP, window: int = 8) -> StragglerPlan:
    return StragglerPlan(action=action, threshold=0.8, window_steps=window, warmup_steps=0, total_steps=10000)


def _watch(job_dir: Path, env: dict[str, str], window: int = 8) -> SlowNodeWatch:
    return SlowNodeWatch(_plan(window=window), job_dir, 0, HOSTS[:2], env, signal_seconds=60, poll_s=0)


def _write(job_dir: Path, cluster: Cluster, steps: int) -> None:
    for timing in cluster.run(steps).values():
        node_timing.write(job_dir, 0, timing)


@pytest.fixture
def batch_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr("slurm_titan.node.batch.slow_watch.slurm.time_left_seconds", lambda job_id: 3600)
    monkeypatch.setenv("SLURM_TITAN_HOME", str(tmp_path / "home"))
    history.append_event(tmp_path, "start", 0, hosts=HOSTS[:2])
    history.append_event(tmp_path, "first-step", 0, step=1)
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_CLUSTER_NAME": "c"}


def test_the_watch_names_a_slow_node_everywhere_and_asks_for_a_swap(tmp_path: Path, batch_env) -> None:
    watch = _watch(tmp_path, batch_env)
    cluster = Cluster([1.0, 1.7])
    swap = []
    for _ in range(8):
        _write(tmp_path, cluster, 2)
        swap.append(watch.poll(cluster.now))
    assert swap.count(True) == 1
    slow = slow_nodes.read_verdict(tmp_path, 0)
    assert (slow.host, slow.action) == ("n2", SWAP) and "gains" in slow.why
    [event] = history.read_attempts(tmp_path)[0].slow
    assert (event["host"], event["action"]) == ("n2", SWAP)
    [entry] = ledger.read(tmp_path / "home/nodes/c.jsonl")
    assert (entry.node, entry.kind, entry.excluded) == ("n2", "slow", True)
    assert "n2" in ledger.avoid([entry], entry.time + 60)  # the next job keeps off it
    scores = slow_nodes.read_scores(tmp_path)
    assert scores and scores[-1].scores["n2"] == pytest.approx(1 / 1.7, abs=0.01)


def test_without_a_spare_the_watch_only_alerts(tmp_path: Path, batch_env) -> None:
    batch_env["SLURM_JOB_NODELIST"] = "n[1-2]"
    watch = _watch(tmp_path, batch_env)
    cluster = Cluster([1.0, 1.7])
    for _ in range(8):
        _write(tmp_path, cluster, 2)
        assert watch.poll(cluster.now) is False
    assert slow_nodes.read_verdict(tmp_path, 0).action == ALERT
    assert SlowNodeWatch.for_attempt(SPEC, tmp_path, 0, HOSTS, batch_env) is None  # the judge is off
    spec = replace(SPEC, straggler=_plan())
    assert SlowNodeWatch.for_attempt(spec, tmp_path, 0, HOSTS, batch_env) is not None
    assert BatchSpec.from_json(spec.to_json()) == spec  # the batch shell reads what the plan wrote


def test_the_step_watcher_ends_a_swapped_attempt_with_one_warning_signal(tmp_path: Path, batch_env) -> None:
    srun = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGUSR2, lambda *a: sys.exit(75))\nprint(flush=True)\n"
                             "time.sleep(30)"], stdout=subprocess.PIPE)
    srun.stdout.readline()  # its handler is in place
    watch = _watch(tmp_path, batch_env, window=4)
    cluster = Cluster([1.0, 2.0])
    _write(tmp_path, cluster, 2)
    watch.poll(cluster.now)
    _write(tmp_path, cluster, 6)
    assert step_watch.watch(tmp_path, 0, HOSTS[:2], srun.pid, poll_s=0.05, slow=watch) == []
    assert srun.wait(timeout=10) == 75  # it saved and stopped, as every rank does on Slurm's warning


def test_finish_swaps_the_slow_node_for_the_spare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job_dir, bin_dir = tmp_path / "job", tmp_path / "bin"
    job_dir.mkdir(), bin_dir.mkdir()
    report = '{"host": "x", "exit_code": 0, "ranks": {}, "first_failure": null}'
    (bin_dir / "srun").write_text("#!/bin/sh\nd=$JOB_DIR/attempts/$SLURM_TITAN_ATTEMPT_INDEX; mkdir -p $d\n"
                                  "echo \"$SLURM_TITAN_NODES\" > $d/nodes\n"
                                  f"for n in 0 1; do echo '{report}' > $d/node-$n.json; done\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    (job_dir / "42_submission.sh").write_text("#!/bin/bash\n# command\nsrun --nodes=2 true\n# teardown\n")
    run_folder.attempt_folder(job_dir, 0).mkdir(parents=True)
    for node in (0, 1):
        node_report(job_dir, 0, node, HOSTS[node], ExitCode.PREEMPTED, None)
    run_folder.trained_step_file(job_dir, 0).write_text("40")
    slow_nodes.write_verdict(job_dir, 0, SlowNode(host="n2", node=1, score=0.6, step=40, since_step=20, time=1.0,
                                                  action=SWAP, why="a swap gains 900 s"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for name, value in {"JOB_DIR": str(job_dir), "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]",
                        envvars.ATTEMPT_INDEX: "0", envvars.NODES: "n1,n2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(finish.slurm, "time_left_seconds", lambda job_id: 3600)
    write_batch_spec(job_dir, retry=RetryPolicy(max_requeues=0, max_failures=0, max_failures_without_progress=1))
    assert finish.main(["--job-dir", str(job_dir), "--srun-exit-code", "0"]) == 0
    attempts = history.read_attempts(job_dir)
    assert [(a.reason, a.action) for a in attempts] == [(SLOW_NODE, RESTART), ("finished", "stop")]
    assert attempts[0].excluded == ["n2"] and attempts[0].culprit == "n2" and "slow node n2" in attempts[0].cause
    assert (job_dir / "attempts/1/nodes").read_text().strip() == "n1,n3"
    assert "n2" in json.loads(run_folder.excluded_nodes_file(job_dir).read_text())


def test_a_slow_event_does_not_disturb_the_attempts_other_fields(tmp_path: Path) -> None:
    history.append_event(tmp_path, "start", 0, hosts=["n1", "n2"])
    history.append_event(tmp_path, "slow", 0, host="n2", score=0.6, step=40, since_step=20, action="alert", why="x")
    [attempt] = history.read_attempts(tmp_path)
    assert attempt.extra == {} and attempt.slow[0]["host"] == "n2" and attempt.hosts == ["n1", "n2"]


def test_usr2_is_what_the_supervisor_takes_as_a_stop() -> None:
    from slurm_titan.signals import STOP_SIGNALS

    assert signal.SIGUSR2 in STOP_SIGNALS
