"""While an attempt runs, judge its nodes' speed and act on a slow one (runs in the batch shell's step watcher).

Every POLL_S the watcher reads the nodes' timing files (records.node_timing: one listing), hands them to the
judge (node.batch.straggler) and keeps each judgment in `attempts/<A>/node-scores.jsonl`. A node named slow is
written down everywhere it is looked for: `attempts/<A>/slow-node.json` (what `finish` reads), a `slow` event
in the run history (`status`, the report), the node ledger (kind `slow`: the next job avoids it) and the
`slow node` alert. With `swap` (a spare node free, and the gain over the time left above the swap's measured
cost) :meth:`SlowNodeWatch.poll` answers True: the step watcher then sends srun Slurm's warning signal, every
rank saves the current step and stops (rank.preemption), and `finish` restarts on the spare without the slow
node, counting no failure. Nothing here ends the run, counts a crash, or touches a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from slurm_titan import slurm
from slurm_titan.errors import ClusterError
from slurm_titan.failure_kinds import SLOW
from slurm_titan.hostlist import expand_hostlist
from slurm_titan.node.batch import allocation, notify
from slurm_titan.node.batch.straggler import Candidate, Judge, choose_action, swap_cost_s
from slurm_titan.node.batch_spec import BatchSpec
from slurm_titan.node.node_log import say
from slurm_titan.node.straggler_config import StragglerPlan
from slurm_titan.records import history, ledger, node_timing, slow_nodes
from slurm_titan.records.slow_nodes import OFF, SWAP, SlowNode

POLL_S = 5.0  # the nodes replace their timing files every node.supervisor.timing.PERIOD_S


class SlowNodeWatch:
    """One attempt's judge, its records and its action."""

    def __init__(self, plan: StragglerPlan, job_dir: Path, attempt: int, hosts: list[str], env: Mapping[str, str],
                 *, signal_seconds: int, poll_s: float = POLL_S) -> None:
        self.plan, self.job_dir, self.attempt, self.hosts, self.env = plan, job_dir, attempt, hosts, dict(env)
        self.signal_seconds, self.poll_s = signal_seconds, poll_s
        self.judge = Judge(attempt=attempt, hosts=hosts, threshold=plan.threshold, window_steps=plan.window_steps,
                           warmup_steps=plan.warmup_steps)
        self._next = 0.0

    @classmethod
    def for_attempt(cls, spec: BatchSpec, job_dir: Path, attempt: int, hosts: list[str],
                    env: Mapping[str, str]) -> SlowNodeWatch | None:
        """The attempt's watch, None when the job's judge is off."""
        if spec.straggler.action == OFF:
            return None
        return cls(spec.straggler, job_dir, attempt, hosts, env, signal_seconds=spec.signal_seconds)

    def poll(self, now: float | None = None) -> bool:
        """Judge once every `poll_s`; True when a slow node is to be swapped (the attempt must end)."""
        now = time.time() if now is None else now
        if now < self._next:
            return False
        self._next = now + self.poll_s
        line, candidate = self.judge.offer(node_timing.read_all(self.job_dir, self.attempt), now)
        if line is not None:
            try:
                slow_nodes.append_scores(self.job_dir, self.attempt, line)
            except OSError as error:
                say(f"WARNING: node scores not kept ({error})")
        return candidate is not None and self.name(candidate, now).action == SWAP

    def name(self, candidate: Candidate, now: float) -> SlowNode:
        """Decide the action on `candidate` and write it down (verdict, history, ledger, alert)."""
        job_id = self.env.get("SLURM_JOB_ID", "?")
        action, why = choose_action(
            action=self.plan.action, spare=self._spare_free(), score=candidate.score,
            step_wall_s=candidate.step_wall_s,
            steps_left=self.plan.total_steps - candidate.step if self.plan.total_steps is not None else None,
            time_left_s=self._time_left_s(job_id),
            cost_s=swap_cost_s(history.read_attempts(self.job_dir), self.attempt, candidate.step_wall_s))
        slow = SlowNode(host=candidate.host, node=candidate.node, score=round(candidate.score, 4),
                        step=candidate.step, since_step=candidate.since_step, time=now, action=action, why=why,
                        signal=candidate.signal)
        slow_nodes.write_verdict(self.job_dir, self.attempt, slow)
        history.append_event(self.job_dir, "slow", self.attempt, host=slow.host, score=slow.score, step=slow.step,
                             since_step=slow.since_step, action=action, why=why)
        ledger.record_failure(slow.host, job_id, SLOW, slow.describe(), action == SWAP, self.env)
        summary = f"{slow.describe()} in attempt {self.attempt}: " + (
            "swapping it for a spare node" if action == SWAP else "training goes on") + f" ({why})"
        say(summary)
        notify.send("slow node", notify.JobRef.from_env(self.env), summary, notify.spec_from_env(self.env))
        return slow

    def _spare_free(self) -> bool:
        """A node of the allocation outside this attempt that the run has not left out."""
        nodelist = self.env.get("SLURM_JOB_NODELIST")
        allocated = expand_hostlist(nodelist) if nodelist else []
        left_out = allocation.read_excluded(self.job_dir)
        return any(host not in self.hosts and host not in left_out for host in allocated)

    def _time_left_s(self, job_id: str) -> float | None:
        """The allocation's time left before Slurm's warning signal; None when Slurm does not say."""
        try:
            left = slurm.time_left_seconds(job_id)
        except ClusterError:
            return None
        return None if left is None else max(0.0, left - self.signal_seconds)
