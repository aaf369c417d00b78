"""The report as one self-contained HTML page: plotly's figures with plotly.js inlined, so the page
needs no network when it is viewed (https://plotly.com/python/interactive-html-export/: `to_html`
with `include_plotlyjs=False` for each figure, the library once from `plotly.offline.get_plotlyjs`).
"""

from __future__ import annotations

import bisect
import html
import math
import time
from collections.abc import Collection, Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from slurm_titan.report.data import Phase, RunReport, StepPoint

PHASE_COLOURS = {"queued": "#bdbdbd", "starting": "#fdd835", "restoring": "#fb8c00", "retraining": "#ef9a9a",
                 "training": "#43a047", "saving": "#1e88e5", "stopped": "#8e24aa", "hung": "#d81b60",
                 "lost": "#212121", "running": "#a5d6a7"}
ATTEMPT_COLOURS = qualitative.Plotly
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #212121; max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 17px; margin: 18px 0 6px 0; }
.numbers { display: flex; gap: 28px; flex-wrap: wrap; margin: 10px 0; }
.numbers div { font-size: 13px; color: #616161; } .numbers b { display: block; font-size: 24px; color: #212121; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 10px; border-bottom: 1px solid #e0e0e0; }
th { text-align: left; background: #f5f5f5; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.row { display: flex; gap: 40px; flex-wrap: wrap; align-items: flex-start; } .muted { color: #757575; font-size: 12px; }
"""


def _clock(stamp: float | None) -> str:
    if stamp is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) + f".{int(stamp % 1 * 1000):03d}"


def duration(seconds: float) -> str:
    """42 s, 5 min 10 s, 3 h 02 min, 2 d 04 h."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def _colour(attempt: int | None) -> str:
    return ATTEMPT_COLOURS[(attempt or 0) % len(ATTEMPT_COLOURS)]


def _finite(value: float | None) -> float | None:
    """A NaN or infinite loss is left out of its line (plotly draws a gap)."""
    return value if value is not None and math.isfinite(value) else None


def _by_attempt(steps: list[StepPoint]) -> dict[int | None, list[StepPoint]]:
    out: dict[int | None, list[StepPoint]] = {}
    for point in steps:
        out.setdefault(point.attempt, []).append(point)
    return out


def _metric_traces(fig: go.Figure, report: RunReport, wall: bool) -> None:
    """Loss (row 1) and throughput (row 2) of each attempt, one colour per attempt."""
    for attempt, points in _by_attempt(report.steps).items():
        points = [p for p in points if p.time is not None] if wall else points
        xs = [_clock(p.time) for p in points] if wall else [p.step for p in points]
        name = "attempt ?" if attempt is None else f"attempt {attempt}"
        mode = "lines+markers" if len(points) <= 200 else "lines"
        common = {"mode": mode, "legendgroup": name, "line": {"color": _colour(attempt), "width": 1.5},
                  "marker": {"size": 4}, "customdata": [[p.step, _clock(p.time)] for p in points]}
        fig.add_trace(go.Scatter(x=xs, y=[_finite(p.loss) for p in points], name=name,
                                 hovertemplate=f"{name}<br>step %{{customdata[0]}}<br>%{{customdata[1]}}"
                                               "<br>loss %{y:.4f}<extra></extra>", **common), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[p.tps for p in points], name=name, showlegend=False,
                                 hovertemplate=f"{name}<br>step %{{customdata[0]}}<br>%{{customdata[1]}}"
                                               "<br>%{y:,.0f} tokens/s<extra></extra>", **common), row=2, col=1)


def _mark_interruptions(fig: go.Figure, marks: Iterable[tuple[Any, str]]) -> None:
    """A dashed line across the figure at each interruption, its cause written along it."""
    for x, label in marks:
        fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                      line={"color": "#d32f2f", "width": 1.2, "dash": "dash"})
        fig.add_annotation(x=x, y=1, xref="x", yref="paper", text=html.escape(label[:90]), hovertext=html.escape(label),
                           showarrow=False, textangle=-90, xanchor="right", yanchor="top",
                           font={"size": 10, "color": "#d32f2f"})


def _loss_near(ordered: list[tuple[int, float]], step: int) -> float | None:
    """The loss logged at `step` or the nearest step before it; `ordered`: (step, loss) sorted."""
    i = bisect.bisect_right(ordered, (step, math.inf))
    return _finite(ordered[i - 1][1]) if i else None


def step_figure(report: RunReport) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("loss against step", "throughput (tokens/s per device) against step"))
    _metric_traces(fig, report, wall=False)
    ordered = sorted((p.step, p.loss) for p in report.steps)
    checkpoints = [(c, _loss_near(ordered, c.step)) for c in report.checkpoints]
    fig.add_trace(go.Scatter(x=[c.step for c, _ in checkpoints], y=[y for _, y in checkpoints], mode="markers",
                             name="checkpoint committed", marker={"symbol": "diamond", "size": 10, "color": "#1e88e5",
                                                                  "line": {"color": "white", "width": 1}},
                             customdata=[_clock(c.time) for c, _ in checkpoints],
                             hovertemplate="checkpoint step %{x} committed<br>%{customdata}<extra></extra>"),
                  row=1, col=1)
    _mark_interruptions(fig, [(i.step, i.label) for i in report.interruptions if i.step is not None])
    fig.update_layout(height=560, margin={"t": 40, "b": 40, "l": 70, "r": 20}, hovermode="closest",
                      legend={"orientation": "h", "y": -0.1, "traceorder": "normal"})
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig


def wall_figure(report: RunReport) -> go.Figure:
    names = sorted({f"attempt {p.attempt}" for p in report.phases}, key=lambda n: int(n.split()[1]))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.05, row_heights=[0.36, 0.28, 0.36],
                        subplot_titles=("loss against wall time", "throughput (tokens/s per device)",
                                        "attempts: where the time went"))
    _metric_traces(fig, report, wall=True)
    for name in PHASE_COLOURS:
        parts = [p for p in report.phases if p.name == name]
        if parts:
            fig.add_trace(_phase_bars(name, parts), row=3, col=1)
    fig.add_trace(go.Scatter(x=[_clock(c.time) for c in report.checkpoints if c.time is not None],
                             y=["checkpoints"] * sum(c.time is not None for c in report.checkpoints),
                             customdata=[c.step for c in report.checkpoints if c.time is not None],
                             mode="markers", name="checkpoint committed", showlegend=False,
                             marker={"symbol": "diamond", "size": 11, "color": "#1e88e5"},
                             hovertemplate="checkpoint step %{customdata} committed<br>%{x}<extra></extra>"),
                  row=3, col=1)
    _mark_interruptions(fig, [(_clock(i.time), i.label) for i in report.interruptions])
    fig.update_layout(height=820, barmode="overlay", margin={"t": 40, "b": 40, "l": 90, "r": 20},
                      hovermode="closest", legend={"orientation": "h", "y": -0.06, "traceorder": "normal"})
    fig.update_xaxes(type="date")
    fig.update_yaxes(categoryorder="array", categoryarray=["checkpoints", *reversed(names)], row=3, col=1)
    return fig


def score_figure(report: RunReport) -> go.Figure:
    """Each node's score against the other nodes over wall time (1: typical; below the threshold for a window
    of steps: named slow), the nodes named slow marked."""
    fig = go.Figure()
    hosts = sorted({host for line in report.scores for host in line.scores})
    for index, host in enumerate(hosts):
        points = [line for line in report.scores if host in line.scores]
        fig.add_trace(go.Scatter(x=[_clock(p.time) for p in points], y=[p.scores[host] for p in points], name=host,
                                 mode="lines+markers" if len(points) <= 200 else "lines",
                                 line={"color": ATTEMPT_COLOURS[index % len(ATTEMPT_COLOURS)], "width": 1.5},
                                 marker={"size": 4}, customdata=[[p.step, p.attempt] for p in points],
                                 hovertemplate=f"{html.escape(host)}<br>step %{{customdata[0]}} (attempt "
                                               "%{customdata[1]})<br>%{x}<br>score %{y:.2f}<extra></extra>"))
    named = [slow | {"attempt": row["attempt"]} for row in report.attempts for slow in row.get("slow", [])]
    fig.add_trace(go.Scatter(x=[_clock(s["time"]) for s in named], y=[s["score"] for s in named], mode="markers",
                             name="named slow", marker={"symbol": "x", "size": 12, "color": "#d32f2f"},
                             customdata=[[s["host"], s["action"], s["why"]] for s in named],
                             hovertemplate="%{customdata[0]} named slow: %{customdata[1]}<br>%{customdata[2]}"
                                           "<extra></extra>"))
    fig.update_layout(title="node scores: working time per step, the other nodes' median over the node's own",
                      height=360, margin={"t": 40, "b": 40, "l": 70, "r": 20}, hovermode="closest",
                      legend={"orientation": "h", "y": -0.15})
    fig.update_xaxes(type="date")
    return fig


def _phase_bars(name: str, parts: list[Phase]) -> go.Bar:
    return go.Bar(orientation="h", name=name, legendgroup="phases", y=[f"attempt {p.attempt}" for p in parts],
                  base=[_clock(p.start) for p in parts], x=[p.seconds * 1000 for p in parts],
                  marker={"color": PHASE_COLOURS[name], "line": {"width": 0}}, width=0.6,
                  customdata=[[_clock(p.start), _clock(p.end), duration(p.seconds)] for p in parts],
                  hovertemplate=f"%{{y}}: {name}<br>%{{customdata[0]}} to %{{customdata[1]}}<br>%{{customdata[2]}}"
                                "<extra></extra>")


def _table(head: list[str], rows: list[list[Any]], numeric: Collection[int] = frozenset()) -> str:
    cells = "".join("<tr>" + "".join(f"<td class=n>{html.escape(str(v))}</td>" if i in numeric
                                     else f"<td>{html.escape(str(v))}</td>" for i, v in enumerate(row)) + "</tr>"
                    for row in rows)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _numbers(report: RunReport) -> str:
    result = report.goodput
    ratio = "-" if result.ratio is None else f"{result.ratio * 100:.1f}%"
    steps = max((p.step for p in report.steps), default=None)
    facts = [("goodput", ratio), ("wall time since submit", duration(result.wall_s)),
             ("training new steps", duration(result.productive_s)), ("lost", duration(report.lost_s)),
             ("attempts", str(len(report.attempts))), ("steps retrained", str(report.steps_retrained)),
             ("last step logged", "-" if steps is None else str(steps)),
             ("last checkpoint", str(report.checkpoints[-1].step) if report.checkpoints else "-")]
    boxes = "".join(f"<div><b>{html.escape(v)}</b>{html.escape(k)}</div>" for k, v in facts)
    causes = [[cause, duration(s), f"{s / result.wall_s * 100:.1f}%" if result.wall_s else "-"]
              for cause, s in report.lost_by_cause().items() if s > 0.05]
    return (f"<div class=numbers>{boxes}</div><div class=row><div><h2>Time lost, by cause</h2>"
            + _table(["cause", "time", "of wall time"], causes or [["nothing lost", "-", "-"]], {1, 2})
            + "</div><div><h2>Interruptions</h2>"
            + _table(["when", "step", "what"], [[_clock(i.time)[:19], "-" if i.step is None else i.step, i.label]
                                                 for i in report.interruptions] or [["-", "-", "none"]], {1})
            + "</div></div>")


def _attempts_table(report: RunReport) -> str:
    restores: dict[int, float] = {}
    for phase in report.phases:
        if phase.name == "restoring":
            restores[phase.attempt] = restores.get(phase.attempt, 0.0) + phase.seconds
    times = {t.attempt: t for t in report.goodput.attempts}
    rows = []
    for row in report.attempts:
        t = times[row["attempt"]]
        last = row["trained_step"] or row["stopped_at_step"] or row["last_step"]
        job = f" (job {report.job_of[row['attempt']]})" if row["attempt"] in report.job_of else ""
        rows.append([f"{row['attempt']}{job}", ",".join(row["hosts"]), _clock(row["started"])[:19],
                     _clock(row["ended"])[:19], row["reason"] or "running", row["cause"] or "", row["action"] or "",
                     f"{row['first_step'] or '-'}..{last or '-'}", duration(t.queue_s), duration(t.startup_s),
                     duration(restores.get(t.attempt, 0.0)), duration(t.training_s), duration(t.retrained_s),
                     duration(t.stopping_s), t.new_steps, t.retrained_steps, duration(t.lost_s)])
    return _table(["attempt", "nodes", "started", "ended", "reason", "cause", "then", "steps", "queue", "start-up",
                   "of it restore", "training", "of it retrained", "stopping", "new steps", "retrained steps",
                   "lost"], rows, set(range(8, 17)))


def render(report: RunReport, title: str) -> str:
    """The whole page."""
    shown = (wall_figure(report), step_figure(report), *((score_figure(report),) if report.scores else ()))
    figures = "".join(fig.to_html(full_html=False, include_plotlyjs=False, config=PLOT_CONFIG) for fig in shown)
    note = "" if report.steps else "<p class=muted>no step lines in rank 0's log yet</p>"
    checkpoints = _table(["step", "committed at", "attempt"],
                         [[c.step, _clock(c.time)[:19], "-" if c.attempt is None else c.attempt]
                          for c in report.checkpoints] or [["-", "none logged", "-"]], {0})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head>
<body><h1>{html.escape(title)}</h1>
<div class=muted>{html.escape(report.source)}: submitted {_clock(report.submitted)[:19]},
report of {time.strftime("%Y-%m-%d %H:%M:%S")}</div>
{_numbers(report)}{note}{figures}
<h2>Attempts</h2>{_attempts_table(report)}
<h2>Checkpoints committed</h2>{checkpoints}
</body></html>
"""
