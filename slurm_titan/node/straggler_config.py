"""The `straggler:` section: how slow nodes are judged and what is done about them, checked before submitting.

    straggler:
      action: swap          # swap | alert | off; default: swap when slurm.spare_nodes > 0, else alert
      threshold: 0.8        # a node is slow below this score (its working time per step: the median of
                            # the other nodes' over its own)
      window_steps: null    # over its last this many steps; null: the steps that fill WINDOW_S (60 s) of
                            # the attempt's first judged steps (at least MIN_WINDOW_STEPS)
      warmup_steps: 5       # each attempt's first steps are not judged

The batch shell reads the settings, resolved (:class:`StragglerPlan`), from its BatchSpec (node.batch_spec).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from slurm_titan.errors import ConfigError
from slurm_titan.records.slow_nodes import ALERT, OFF, SWAP

Action = Literal["swap", "alert", "off"]
WINDOW_S = 60.0
"""The default window's length in time: at 1.5x slowdown it is judged within 90 s, plus the few seconds the
nodes' timing files and the watcher's poll take (the goal: <= 2 minutes)."""
MIN_WINDOW_STEPS = 3


@dataclass
class StragglerSpec:
    """The `straggler:` section (module docstring)."""

    action: Action | None = None
    threshold: float = 0.8
    window_steps: int | None = None
    warmup_steps: int = 5

    def resolved_action(self, spare_nodes: int) -> str:
        """The action the job takes: the one given, else swap with a spare node and alert without; swap
        without a spare only alerts."""
        if self.action == OFF:
            return OFF
        return SWAP if self.action in (None, SWAP) and spare_nodes > 0 else ALERT


@dataclass(frozen=True, kw_only=True)
class StragglerPlan:
    """What the batch shell's judge needs: the section resolved (the action OFF when nothing is judged) and the
    run's length in steps (None when the config does not say)."""

    action: str
    threshold: float
    window_steps: int | None
    warmup_steps: int
    total_steps: int | None


def check_straggler(where: str, spec: StragglerSpec, spare_nodes: int) -> None:
    """ConfigError for a threshold outside (0, 1), a window or warm-up below its floor; a warning for `swap`
    without a spare node."""
    if not 0 < spec.threshold < 1:
        raise ConfigError(where, "straggler.threshold", f"must be within (0, 1), got {spec.threshold}")
    if spec.window_steps is not None and spec.window_steps < 1:
        raise ConfigError(where, "straggler.window_steps", f"must be >= 1 (or null: sized from the step time), "
                                                           f"got {spec.window_steps}")
    if spec.warmup_steps < 0:
        raise ConfigError(where, "straggler.warmup_steps", f"must be >= 0, got {spec.warmup_steps}")
    if spec.action == SWAP and spare_nodes == 0:
        print(f"slurm-titan: WARNING: {where}: straggler.action is swap but slurm.spare_nodes is 0: a slow node "
              "will only be alerted", file=sys.stderr)
