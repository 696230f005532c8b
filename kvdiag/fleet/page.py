"""The fleet's one self-contained HTML page (no scripts, no external files): a matrix of
targets x (suite, case), each cell's verdict (PASS, FAIL, INCONCLUSIVE, ERROR) with its worst
metric or its reason and a link to that
cell's own report.html, and each target's SQDR over its past runs from the history (an
inline matplotlib SVG, each run's verdict marked). The page is a jinja2 template, autoescaped."""

from __future__ import annotations

from pathlib import Path

from kvdiag.fleet.outcome import Outcome, read_outcomes
from kvdiag.fleet.plan import FleetPlan
from kvdiag.report.style import template

NOT_RUN = "NOT RUN"  # a cell of the plan with no outcome yet
COLORS = {"PASS": "#d4edda", "FAIL": "#f8d7da", "INCONCLUSIVE": "#fde9c8", "ERROR": "#e9d5ff",
          NOT_RUN: "#eeeeee"}
TREND_RUNS = 52
VERDICT_DOTS = {"pass": "#008800", "fail": "#cc0000"}  # any other verdict: amber


def load_outcomes(run_dir: Path) -> tuple[FleetPlan, dict[str, Outcome]]:
    """(fleet.json's plan, {cell id: last outcome}) of a fleet run directory."""
    return FleetPlan.load(run_dir), read_outcomes(run_dir)


def trend(history: Path, spec: str):
    """The target's past runs (oldest first) from the history; empty when there is none."""
    import pandas as pd

    if not Path(history).is_file():
        return pd.DataFrame()
    from kvdiag.regress import history as H

    return H.runs(history, target=spec, last=TREND_RUNS)


def sparkline(frame, prefix: str) -> str:
    """The target's SQDR over its past runs (oldest first) as a small inline SVG drawn by
    matplotlib like every plot of a run (kvdiag.report.plots): one dot per run coloured by its
    verdict, a missing SQDR drawn at 0, and each dot's run, verdict and SQDR on hover."""
    if frame.empty:
        return "<i>no history</i>"
    from kvdiag.report.plots import RC, hover_targets, pyplot, svg

    plt = pyplot()
    measured = [float(v) if v == v and v is not None else None for v in frame["sqdr"]]
    values = [0.0 if v is None else v for v in measured]
    verdicts = [str(v) for v in frame["verdict"]]
    top, n, x = max(max(values), 1e-9), len(values), list(range(len(values)))
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(240 / 96, 40 / 96))  # 240 x 40 px (a CSS px: 1/96 in)
        ax.plot(x, values, color="#333333", linewidth=1)
        ax.scatter(x, values, s=12, zorder=3, c=[VERDICT_DOTS.get(v, "#b7791f") for v in verdicts])
        hover_targets(ax, x, values, hover, lambda a, _: f"run {int(a) + 1} of {n} · "
                      f"{verdicts[int(a)]} · SQDR {_number(measured[int(a)])}")
        ax.set_xlim(-0.03 * max(n - 1, 1), 1.03 * max(n - 1, 1))
        ax.set_ylim(-top / 6, top * 7 / 6)
        ax.set_axis_off()
        fig.subplots_adjust(left=0, right=1, bottom=0, top=1)
        return svg(fig, prefix, hover)


# jinja2, autoescaped (as kvdiag.report.html)
_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>kvdiag fleet {{ name }}</title>
<style>body{font-family:sans-serif} table{border-collapse:collapse}
td,th{border:1px solid #999;padding:4px 8px;vertical-align:top}</style></head><body>
<h1>kvdiag fleet: {{ name }}</h1>
<p>{{ total }}. Fleet file: <code>{{ fleet }}</code>; history:
<code>{{ history }}</code>. PASS: no regression and the run's own ground truth holds,
with the trigger reached; FAIL: a metric regressed (the first one and its rounds shown) or
corruption was found; INCONCLUSIVE: the run proved nothing (the trigger was not reached), even
if every metric matched its baseline; ERROR: the cell could not be measured (dead endpoint,
task error, time limit) or its ground truth hit the cache.</p>
<table><tr><th>target</th>{% for suite, case in columns %}<th>{{ suite }}<br>{{ case }}</th>{% endfor %}\
<th>SQDR, past runs (green: pass, red: fail, amber: other)</th></tr>
{% for name, spec, cells, sparkline in rows %}<tr><th>{{ name }}<br><small>{{ spec }}</small></th>\
{% for cell in cells %}{% if cell %}{% set cid, o, linked = cell %}\
{% set status = o.status if o else not_run %}\
<td style="background:{{ colors.get(status, "#eeeeee") }}"><b>{{ status }}</b>\
{% if linked %} \
<a href="{{ cid }}/report.html">report</a>{% endif %}<br><small>{{ o.worst if o else "" }}</small>\
{% if o and o.events %}<br><small>{{ o.events }}</small>{% endif %}</td>\
{% else %}<td></td>{% endif %}{% endfor %}<td>{{ sparkline }}</td></tr>{% endfor %}</table></body></html>
"""



def render(run_dir: Path) -> str:
    from markupsafe import Markup

    run_dir = Path(run_dir)
    plan, last = load_outcomes(run_dir)
    columns = list(dict.fromkeys((c.suite_name, c.case) for c in plan.cells))
    cell_of = {(c.target, c.suite_name, c.case): c.id for c in plan.cells}
    rows, counts = [], {}
    for t in plan.targets:
        cells = []  # (cell id, its last outcome or None: not run, whether its report exists)
        for s, k in columns:
            cid = cell_of.get((t.name, s, k))
            if cid is None:
                cells.append(None)  # no such cell
                continue
            o = last.get(cid)
            status = o.status if o else NOT_RUN
            counts[status] = counts.get(status, 0) + 1
            cells.append((cid, o, bool(o and o.run_dir) and (run_dir / cid / "report.html").is_file()))
        past = trend(Path(plan.history), t.spec)
        rows.append((t.name, t.spec, cells, Markup(sparkline(past, f"sqdr{len(rows)}"))))
    return template(_PAGE).render(
        name=run_dir.name, fleet=plan.fleet, history=plan.history, columns=columns,
        total=", ".join(f"{n} {s}" for s, n in sorted(counts.items())), rows=rows,
        colors=COLORS, not_run=NOT_RUN)


def _number(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4g}"


def write_page(run_dir: Path) -> Path:
    path = Path(run_dir) / "fleet.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(run_dir), encoding="utf-8")
    tmp.replace(path)
    return path
