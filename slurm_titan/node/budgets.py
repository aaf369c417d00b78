"""How long a rank may spend in each phase before the watchdog calls it a hang (pure, unit-tested).

Steps: a generous `first_step_s` for the first step of an attempt (compilation, warm-up), then
max(`step_floor_s`, `step_factor` x the slowest step seen), capped `WATCHDOG_MARGIN_S` before torch's
collective timeout (config.WatchdogSpec gives the order of firing). A rank the kernel shows stopped at every
poll has a shorter step budget: max(`stopped_s`, `step_factor` x the slowest step), never longer than the
step budget. The slowest step is learned: node 0's
supervisor keeps it in `<job>/watchdog.json`, and the next attempt starts from it, calibrated (the way
nvidia-resiliency-ext keeps its section timeouts in `ft_state.json`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_titan.records.rank_progress import Phase, Progress
from slurm_titan.records.run_folder import calibration_file


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """`watchdog` and `timeouts` as the node needs them (node.spec.NodeSpec carries one; picklable)."""

    startup_s: int
    restore_s: int
    first_step_s: int
    step_floor_s: int
    step_factor: int
    save_s: int
    upload_s: int
    step_cap_s: int  # timeouts.collective_s - WATCHDOG_MARGIN_S
    stopped_s: int

    def step_budget(self, slowest_step_s: float) -> float:
        return min(max(float(self.step_floor_s), self.step_factor * slowest_step_s), float(self.step_cap_s))

    def stopped_budget(self, progress: Progress, learned_step_s: float) -> float | None:
        """Seconds a rank may stay stopped (seen stopped at every poll) in a step after the first; None in
        every other phase (the first step, start-up, restore and saves keep their own budgets)."""
        if progress.phase != Phase.STEP or progress.steps_done == 0:
            return None
        slowest = max(progress.slowest_step_s, learned_step_s)
        return min(max(float(self.stopped_s), self.step_factor * slowest), self.step_budget(slowest))

    def for_progress(self, progress: Progress, learned_step_s: float) -> float | None:
        """Seconds allowed since `progress.since`; None when the phase is not watched (the rank is done)."""
        if progress.phase == Phase.STEP:
            if progress.steps_done == 0:
                return float(self.first_step_s)
            return self.step_budget(max(progress.slowest_step_s, learned_step_s))
        return {Phase.STARTUP: self.startup_s, Phase.RESTORE: self.restore_s, Phase.SAVE: self.save_s,
                Phase.UPLOAD: self.upload_s}.get(progress.phase)


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
    path = calibration_file(job_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(calibration)) + "\n")
    tmp.replace(path)
