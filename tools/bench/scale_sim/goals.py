"""What the issue asks of each figure, judged over a sweep's rows: run where the sweep reached the ranks, else
fitted (a power law through the largest three points) and said so."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Row = dict[str, float]


def fit(rows: list[Row], key: str, at: float, x: str = "ranks") -> float:
    """``key`` at ``x == at``: a power law through the rows' largest three points (least squares in log-log)."""
    pts = [(math.log(r[x]), math.log(max(r[key], 1e-9))) for r in rows[-3:]]
    mx, my = sum(p for p, _ in pts) / len(pts), sum(q for _, q in pts) / len(pts)
    return math.exp(my + exponent(rows, key, x) * (math.log(at) - mx))


def exponent(rows: list[Row], key: str, x: str = "ranks") -> float:
    """The growth exponent b of ``key ~ x^b`` over the rows' largest three points (0 with fewer than two)."""
    pts = [(math.log(r[x]), math.log(max(r[key], 1e-9))) for r in rows[-3:]]
    if len(pts) < 2:
        return 0.0
    mx, my = sum(p for p, _ in pts) / len(pts), sum(q for _, q in pts) / len(pts)
    return sum((p - mx) * (q - my) for p, q in pts) / max(sum((p - mx) ** 2 for p, _ in pts), 1e-12)


@dataclass(frozen=True)
class Goal:
    """``key`` of the rows is at most (``most``) or at least ``limit``: ``at`` that many ranks (``kind="at"``, run
    or fitted), in every row run (``"every"``), in the row of the most ranks run (``"largest"``: a ratio of counts
    that small runs make too noisy to judge), or as the exponent of its growth in ``x`` (``"growth"``)."""

    text: str
    key: str
    limit: float
    kind: Literal["at", "every", "largest", "growth"] = "at"
    at: int = 4096
    most: bool = True
    x: str = "ranks"


@dataclass(frozen=True)
class Verdict:
    goal: Goal
    value: float
    how: str  # "run at 512 ranks", "fitted at 4,096 ranks", "worst of 64..512 run", "exponent over 128..512"

    @property
    def passed(self) -> bool:
        return self.value <= self.goal.limit if self.goal.most else self.value >= self.goal.limit

    def line(self) -> str:
        verdict, sign = "PASS" if self.passed else "FAIL", "<=" if self.goal.most else ">="
        return f"  {verdict}  {self.goal.text}: {self.value:.3g} {sign} {self.goal.limit:g} ({self.how})"


def judge(rows: list[Row], goal: Goal) -> Verdict:
    """The goal's verdict over ``rows`` (sorted by ranks, each holding ``goal.key``)."""
    rows = [r for r in rows if goal.key in r]
    if not rows:
        raise ValueError(f"no row has {goal.key!r}")
    span = f"{int(rows[0]['ranks'])}..{int(rows[-1]['ranks'])} ranks"
    if goal.kind == "every":
        pick = max if goal.most else min
        return Verdict(goal, pick(r[goal.key] for r in rows), f"worst of {span}, run")
    if goal.kind == "largest":
        return Verdict(goal, rows[-1][goal.key], f"run at {int(rows[-1]['ranks']):,} ranks, the most run")
    if goal.kind == "growth":
        return Verdict(goal, exponent(rows, goal.key, goal.x), f"fitted exponent over {span}")
    run = next((r for r in rows if r["ranks"] == goal.at), None)
    if run is not None:
        return Verdict(goal, run[goal.key], f"run at {goal.at:,} ranks")
    return Verdict(goal, fit(rows, goal.key, goal.at), f"fitted at {goal.at:,} ranks from {span}")
