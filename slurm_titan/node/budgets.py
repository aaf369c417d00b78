"""How long a rank may spend in each phase before the watchdog calls it a hang (pure, unit-tested).

Steps: a generous `first_step_s` for the first step of an attempt (compilation, warm-up), then
max(`step_floor_s`, `step_factor` x the slowest step seen), capped `WATCHDOG_MARGIN_S` before torch's
collective timeout (WatchdogSpec gives the order of firing). A rank the kernel shows stopped at every
poll, with no CPU time used since, has a shorter budget in every phase: `stopped_s`, never longer than the phase's.
The slowest step is learned: node 0's supervisor keeps it in `<job>/watchdog.json`, and the next attempt starts
from it, calibrated (the way nvidia-resiliency-ext keeps its section timeouts in `ft_state.json`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan.records.rank_progress import Phase, Progress
from slurm_titan.records.run_folder import calibration_file
from slurm_titan.records.whole_file import replace_text

WATCHDOG_MARGIN_S = 60
"""How much sooner than torch's process-group timeout every watchdog budget must end: the time to notice
(one poll), dump every rank's stacks and write the node report while the peers still wait."""


@dataclass
class WatchdogSpec:
    """The node supervisor's progress watchdog (slurm_titan.node.supervisor.watchdog; the
    `watchdog:` section of the job config, validated by launch.config): a rank that makes no progress
    within its phase's budget is a hang; its node's stacks are dumped, its ranks killed, the attempt recovered.

    Budgets, in seconds: `startup_s` (process start to the restore), `restore_s` (the checkpoint load), the
    `first_step_s` of each attempt (compilation, warm-up), every later step max(`step_floor_s`, `step_factor` x
    the slowest step seen in this run, kept in the run folder for the next attempt), `save_s` for one
    checkpoint save, `upload_s` for the wait on the uploads at the end (or before a requeue). A rank that the
    kernel shows stopped (SIGSTOP, SIGTSTP; not a tracer's stop, someone looking) at every poll, its CPU time
    unchanged since the first, is hung after `stopped_s` instead, in any phase (a save's as a step's) and however
    long its steps are: a stopped process neither computes, writes nor waits for a peer, and its node names it
    without waiting for the other nodes' views. Uninterruptible sleep (D) keeps the step budget: a rank waiting on
    its device or on a slow mount can show it while healthy.

    Order of firing (checked by launch.config): a budget ends at least WATCHDOG_MARGIN_S before the torch
    process-group timeout its peers wait under: `timeouts.startup_s` for start-up, restore and the first step,
    `timeouts.collective_s` for steps (the learned budget is capped there) and saves. The final upload has no
    peer waiting in a collective. Off (`enable: false`), a hang lasts until those timeouts fire. The ranks
    tell their progress from the checkpoint hook: without `checkpoint.enable` there is no watchdog either (one
    warning at submit says so).
    """

    enable: bool = True
    startup_s: int = 900
    restore_s: int = 900
    first_step_s: int = 900
    step_floor_s: int = 45  # with the watchdog's polling, a hang is named within 60 s (the goal)
    step_factor: int = 3
    save_s: int = 600
    upload_s: int = 1800
    stopped_s: int = 3  # 7 polls of the watchdog 0.5 s apart, each seeing it stopped with its CPU time frozen


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """The watchdog's budgets as the node applies them: the `watchdog:` section and the step cap it derives from
    `timeouts` (node.spec.NodeSpec carries one; picklable)."""

    watchdog: WatchdogSpec
    step_cap_s: int  # timeouts.collective_s - WATCHDOG_MARGIN_S

    @classmethod
    def from_spec(cls, watchdog: WatchdogSpec, collective_s: int) -> Budgets:
        """The budgets of a job whose collectives time out after `collective_s` (timeouts.collective_s)."""
        return cls(watchdog=watchdog, step_cap_s=collective_s - WATCHDOG_MARGIN_S)

    def step_budget(self, slowest_step_s: float) -> float:
        watchdog = self.watchdog
        return min(max(float(watchdog.step_floor_s), watchdog.step_factor * slowest_step_s), float(self.step_cap_s))

    def stopped_budget(self, progress: Progress, learned_step_s: float) -> float | None:
        """Seconds a rank may stay stopped (seen stopped at every poll, its CPU time frozen), in any phase the
        watchdog watches (a save's as a step's), never longer than the phase's own budget; None when the rank is
        done."""
        budget = self.for_progress(progress, learned_step_s)
        return None if budget is None else min(float(self.watchdog.stopped_s), budget)

    def for_progress(self, progress: Progress, learned_step_s: float) -> float | None:
        """Seconds allowed since `progress.since`; None when the phase is not watched (the rank is done)."""
        watchdog = self.watchdog
        if progress.phase == Phase.STEP:
            if progress.steps_done == 0:
                return float(watchdog.first_step_s)
            return self.step_budget(max(progress.slowest_step_s, learned_step_s))
        return {Phase.STARTUP: watchdog.startup_s, Phase.RESTORE: watchdog.restore_s, Phase.SAVE: watchdog.save_s,
                Phase.UPLOAD: watchdog.upload_s}.get(progress.phase)


@dataclass(frozen=True)
class Calibration:
    """What the run learned: its slowest step (not the first of an attempt), in seconds."""

    slowest_step_s: float = 0.0


def read_calibration(job_dir: Path) -> Calibration:
    """The run's calibration; an empty one when there is none yet or it does not parse."""
    try:
        data = json.loads(calibration_file(job_dir).read_text())
        return Calibration(float(data["slowest_step_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Calibration()


def write_calibration(job_dir: Path, calibration: Calibration) -> None:
    """Replace the run's calibration at once (tmp + rename: a reader sees the old or the new)."""
    replace_text(calibration_file(job_dir), json.dumps(asdict(calibration)) + "\n")
