"""The fleet's one self-contained HTML page (no scripts, no external files): a matrix of
targets x (suite, case), each cell's verdict (PASS, FAIL, INCONCLUSIVE, ERROR) with its worst
metric or its reason and a link to that
cell's own report.html, and each target's SQDR over its past runs from the history (an
inline SVG line, failed runs marked)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from kvdiag.errors import KvdiagError

COLORS = {"PASS": "#d4edda", "FAIL": "#f8d7da", "INCONCLUSIVE": "#fde9c8", "ERROR": "#e9d5ff",
          "NOT RUN": "#eeeeee"}
TREND_RUNS = 52


def load_outcomes(run_dir: Path) -> tuple[dict, dict]:
    """(fleet.json's plan, {cell id: last outcome}) of a fleet run directory."""
    run_dir = Path(run_dir)
    if not (run_dir / "fleet.json").is_file():
        raise KvdiagError(f"{run_dir}: not a fleet run (no fleet.json)")
    plan = json.loads((run_dir / "fleet.json").read_text())
    last = {}
    cells = run_dir / "cells.jsonl"
    for line in cells.read_text().splitlines() if cells.is_file() else []:
        if line.strip():
            o = json.loads(line)
            last[o["cell"]] = o
    return plan, last


def trend(history: Path, spec: str):
    """The target's past runs (oldest first) from the history; empty when there is none."""
    import pandas as pd

    if not Path(history).is_file():
        return pd.DataFrame()
    from kvdiag.regress import history as H

    return H.runs(history, target=spec, last=TREND_RUNS)


def _svg(frame) -> str:
    if frame.empty:
        return "<i>no history</i>"
    values = [float(v) if v == v and v is not None else 0.0 for v in frame["sqdr"]]
    top = max(max(values), 1e-9)
    w, h, n = 240, 40, len(values)
    pts = [(5 + (w - 10) * (i / max(n - 1, 1)), h - 5 - (h - 10) * v / top) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    marks = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{"#080" if v == "pass" else "#c00" if v == "fail" else "#b7791f"}"/>'
                    for (x, y), v in zip(pts, frame["verdict"]))
    return (f'<svg width="{w}" height="{h}" role="img"><title>SQDR over the last {n} runs '
            f'(max {top:.4g})</title><polyline fill="none" stroke="#333" points="{line}"/>{marks}</svg>')


def render(run_dir: Path) -> str:
    run_dir = Path(run_dir)
    plan, last = load_outcomes(run_dir)
    columns = []
    for c in plan["cells"]:
        if (c["suite_name"], c["case"]) not in columns:
            columns.append((c["suite_name"], c["case"]))
    cell_of = {(c["target"], c["suite_name"], c["case"]): c["id"] for c in plan["cells"]}
    esc = html.escape
    head = "".join(f"<th>{esc(s)}<br>{esc(k)}</th>" for s, k in columns)
    rows, counts = [], {}
    for t in plan["targets"]:
        tds = []
        for s, k in columns:
            cid = cell_of.get((t["name"], s, k))
            if cid is None:
                tds.append("<td></td>")
                continue
            o = last.get(cid, {"status": "NOT RUN", "worst": ""})
            counts[o["status"]] = counts.get(o["status"], 0) + 1
            link = (f' <a href="{esc(cid)}/report.html">report</a>'
                    if o.get("run_dir") and (run_dir / cid / "report.html").is_file() else "")
            tds.append(f'<td style="background:{COLORS.get(o["status"], "#eeeeee")}"><b>{o["status"]}</b>{link}'
                       f'<br><small>{esc(o.get("worst") or "")}</small>'
                       + (f'<br><small>{esc(o["events"])}</small>' if o.get("events") else "") + '</td>')
        past = trend(Path(plan["history"]), t["spec"])
        rows.append(f"<tr><th>{esc(t['name'])}<br><small>{esc(t['spec'])}</small></th>{''.join(tds)}"
                    f"<td>{_svg(past)}</td></tr>")
    total = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kvdiag fleet {esc(run_dir.name)}</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}}
td,th{{border:1px solid #999;padding:4px 8px;vertical-align:top}}</style></head><body>
<h1>kvdiag fleet: {esc(run_dir.name)}</h1>
<p>{esc(total)}. Fleet file: <code>{esc(plan['fleet'])}</code>; history:
<code>{esc(plan['history'])}</code>. PASS: no regression and the run's own ground truth holds,
with the trigger reached; FAIL: a metric regressed (the first one and its rounds shown) or
corruption was found; INCONCLUSIVE: the run proved nothing (the trigger was not reached), even
if every metric matched its baseline; ERROR: the cell could not be measured (dead endpoint,
task error, time limit) or its ground truth hit the cache.</p>
<table><tr><th>target</th>{head}<th>SQDR, past runs (green: pass, red: fail, amber: other)</th></tr>
{''.join(rows)}</table></body></html>
"""


def write_page(run_dir: Path) -> Path:
    path = Path(run_dir) / "fleet.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(run_dir), encoding="utf-8")
    tmp.replace(path)
    return path
