"""The pages kvdiag builds with jinja2 besides a run's report (the detection matrix, the
isolation audit, kvdiag compare, the fleet): what a summary holds is escaped, never markup;
links and verdict classes are where they were; the fleet's sparklines are matplotlib SVG."""

from __future__ import annotations

import json

import pandas as pd

from kvdiag.fleet import page as fleet_page
from kvdiag.report import compare, isolation, matrix
from tests.kvdiag import summaries

EVIL = "<script>alert('x')</script>&"
ESCAPED = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;"


def _clean(html: str) -> None:
    assert "<script" not in html and ESCAPED in html


def test_matrix_page_escapes_and_links_each_run():
    row = {"fault": EVIL, "path": "live", "verdict": "fail", "expected": "fail", "caught": True,
           "run_dir": "/runs/matrix/fault-live"}
    html = matrix.page(summaries.matrix(reason=EVIL, matrix=[
        row, row | {"caught": False, "run_dir": None, "verdict": "pass"}]))
    _clean(html)
    assert '<tr class="caught">' in html and '<tr class="missed">' in html
    assert '<td class="fail"><b>FAIL</b> <a href="fault-live/report.html">report</a></td>' in html
    assert html.count("<td>-</td>") == 2 * 8 and html.endswith("</html>\n")


def test_isolation_and_compare_pages_escape_the_summary():
    html = isolation.page(summaries.isolation(reason=EVIL, command=EVIL, target=EVIL))
    _clean(html)
    assert '<header class="verdict-pass">' in html and html.count(ESCAPED) == 3
    html = compare.page(summaries.compare(verdict="fail", reason=EVIL, command="kvdiag compare",
                                          targets=[{"target": EVIL, "verdict": "fail", "reason": "r",
                                                    "sqdr": 0.25, "run_dir": "t-run"}]))
    _clean(html)
    assert '<td class="fail"><b>FAIL</b> <a href="t-run/report.html">report</a></td>' in html
    assert "<td>0.2500</td><td>-</td>" in html and "No target was measured" in html


def test_fleet_page_escapes_and_draws_sparklines_with_matplotlib(tmp_path, monkeypatch):
    cell = {"target": "a", "suite": "s", "suite_name": "smoke", "case": "trigger",
            "id": "a.smoke.trigger"}
    (tmp_path / "fleet.json").write_text(json.dumps({
        "fleet": "fleet.yaml", "history": str(tmp_path / "h.sqlite"), "baseline": "b.json",
        "targets": [{"name": "a", "spec": "reference:guarded", "kind": "reference"},
                    {"name": "b", "spec": EVIL, "kind": "url"}],
        "cells": [cell, cell | {"target": "b", "id": "b.smoke.trigger"}]}))
    (tmp_path / "cells.jsonl").write_text(json.dumps(
        {"cell": "a.smoke.trigger", "status": "FAIL", "worst": EVIL, "run_dir": "x"}) + "\n")
    (tmp_path / "a.smoke.trigger").mkdir()
    (tmp_path / "a.smoke.trigger" / "report.html").write_text("")
    past = {"reference:guarded": pd.DataFrame({"sqdr": [0.01, None], "verdict": ["pass", "fail"]}),
            EVIL: pd.DataFrame()}
    monkeypatch.setattr(fleet_page, "trend", lambda history, spec: past[spec])
    html = fleet_page.render(tmp_path)
    _clean(html)
    assert '<b>FAIL</b> <a href="a.smoke.trigger/report.html">report</a>' in html
    assert "<b>NOT RUN</b><br><small></small></td>" in html and "1 FAIL, 1 NOT RUN." in html
    assert html.count('<svg class="plot-svg"') == 1 and "<i>no history</i>" in html
    assert "<title>run 1 of 2 · pass · SQDR 0.01</title>" in html
    assert "<title>run 2 of 2 · fail · SQDR not measured</title>" in html
    assert 'id="sqdr0-' in html  # ids prefixed per target: several sparklines share a page
