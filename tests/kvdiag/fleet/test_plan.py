"""FLEET_RUN/fleet.json and cells.jsonl read typed (kvdiag.fleet.plan, kvdiag.fleet.outcome):
the plan round-trips byte for byte as the driver has always written it, an existing plan
loads, a directory without one is refused; an outcome line of this or an earlier driver reads
back as an Outcome, the last line of a cell winning. In-process, no Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.fleet.outcome import Outcome, read_outcomes
from kvdiag.fleet.plan import FleetPlan, PlanCell
from kvdiag.fleet.spec import Cell, Fleet, FleetTarget
from kvdiag.verdicts import Verdict


def _fleet(tmp_path: Path) -> Fleet:
    targets = [FleetTarget(name="a", spec="reference:guarded", kind="reference", model=None,
                           flags={}, suites=[("smoke", ["trigger"])]),
               FleetTarget(name="u", spec="http://127.0.0.1:1", kind="url", model="m",
                           flags={"tp": "2"}, suites=[("smoke", ["trigger", "natural"])])]
    cells = [Cell(target="a", suite="smoke", suite_name="smoke", case="trigger"),
             Cell(target="u", suite="smoke", suite_name="smoke", case="trigger"),
             Cell(target="u", suite=str(tmp_path / "mine.yaml"), suite_name="mine", case="natural")]
    return Fleet(path=tmp_path / "fleet.yaml", targets=targets, cells=cells,
                 history=tmp_path / "h.sqlite", baseline=tmp_path / "b.json")


def _as_the_driver_wrote_it(fleet: Fleet) -> str:
    """fleet.json as kvdiag.fleet.driver wrote it before the plan was typed."""
    plan = {"fleet": str(fleet.path.resolve()), "history": str(fleet.history.resolve()),
            "baseline": str(fleet.baseline.resolve()),
            "targets": [{"name": t.name, "spec": t.spec, "kind": t.kind} for t in fleet.targets],
            "cells": [c.model_dump() | {"id": c.id} for c in fleet.cells]}
    return json.dumps(plan, indent=2) + "\n"


def test_the_plan_is_written_as_the_driver_always_wrote_it_and_reads_back(tmp_path):
    fleet = _fleet(tmp_path)
    path = FleetPlan.of(fleet).save(tmp_path)
    assert path == tmp_path / "fleet.json"
    assert path.read_text() == _as_the_driver_wrote_it(fleet)
    plan = FleetPlan.load(tmp_path)
    assert plan == FleetPlan.of(fleet)
    assert [c.id for c in plan.cells] == ["a.smoke.trigger", "u.smoke.trigger", "u.mine.natural"]
    assert plan.cells[2] == PlanCell(target="u", suite=str(tmp_path / "mine.yaml"),
                                     suite_name="mine", case="natural", id="u.mine.natural")
    assert [(t.name, t.spec, t.kind) for t in plan.targets] == [
        ("a", "reference:guarded", "reference"), ("u", "http://127.0.0.1:1", "url")]
    assert (plan.fleet, plan.history, plan.baseline) == tuple(
        str((tmp_path / name).resolve()) for name in ("fleet.yaml", "h.sqlite", "b.json"))
    FleetPlan.load(tmp_path).save(tmp_path)  # a plan read back writes the same bytes
    assert path.read_text() == _as_the_driver_wrote_it(fleet)


def test_an_existing_plan_loads_and_a_missing_or_broken_one_is_refused(tmp_path):
    data = json.loads(_as_the_driver_wrote_it(_fleet(tmp_path)))
    (tmp_path / "fleet.json").write_text(json.dumps(data | {"later": "ignored"}))
    assert FleetPlan.load(tmp_path).cells[0].id == "a.smoke.trigger"
    with pytest.raises(KvdiagError, match="not a fleet run"):
        FleetPlan.load(tmp_path / "nowhere")
    (tmp_path / "fleet.json").write_text(json.dumps({k: v for k, v in data.items() if k != "cells"}))
    with pytest.raises(KvdiagError, match="not a fleet plan"):
        FleetPlan.load(tmp_path)


def test_outcomes_read_back_typed_the_last_line_of_a_cell_winning(tmp_path):
    first = Outcome("a.smoke.trigger", "a", "reference:guarded", "smoke", "trigger", Verdict.ERROR,
                    "RuntimeError: boom")
    again = Outcome("a.smoke.trigger", "a", "reference:guarded", "smoke", "trigger", Verdict.PASS,
                    "sqdr 0.0, brai 0.0", run_dir="/runs/a", run_id="r1", seconds=1.5,
                    events="7/8 events (not: preemption)")
    lines = [json.dumps(o.record()) for o in (first, again)]
    lines.append(json.dumps({"cell": "u.smoke.trigger", "status": "FAIL", "worst": "sqdr: rounds 3",
                             "run_dir": "x"}))  # an earlier driver's shorter line
    (tmp_path / "cells.jsonl").write_text("\n".join(lines) + "\n\n")
    got = read_outcomes(tmp_path)
    assert list(got) == ["a.smoke.trigger", "u.smoke.trigger"]
    assert got["a.smoke.trigger"] == again and got["a.smoke.trigger"].status == "PASS"
    old = got["u.smoke.trigger"]
    assert (old.verdict, old.worst, old.run_dir, old.events, old.target) == (
        Verdict.FAIL, "sqdr: rounds 3", "x", None, "")
    assert Outcome.from_record({"cell": "c", "status": "weird"}).verdict is Verdict.ERROR
    assert read_outcomes(tmp_path / "nowhere") == {}


def test_the_page_reads_the_typed_plan_and_outcomes(tmp_path, monkeypatch):
    import pandas as pd

    from kvdiag.fleet import page

    fleet = _fleet(tmp_path)
    FleetPlan.of(fleet).save(tmp_path)
    done = Outcome("u.smoke.trigger", "u", "http://127.0.0.1:1", "smoke", "trigger", Verdict.PASS,
                   "sqdr 0.0, brai 0.0", run_dir=str(tmp_path / "u.smoke.trigger"),
                   events="7/8 events (not: preemption)")
    (tmp_path / "cells.jsonl").write_text(json.dumps(done.record()) + "\n")
    (tmp_path / "u.smoke.trigger").mkdir()
    (tmp_path / "u.smoke.trigger" / "report.html").write_text("")
    monkeypatch.setattr(page, "trend", lambda history, spec: pd.DataFrame())
    html = page.render(tmp_path)
    assert "2 NOT RUN, 1 PASS." in html and html.count("<i>no history</i>") == 2
    assert ('<b>PASS</b> <a href="u.smoke.trigger/report.html">report</a><br><small>sqdr 0.0, '
            'brai 0.0</small><br><small>7/8 events (not: preemption)</small></td>') in html
    assert "<b>NOT RUN</b><br><small></small></td>" in html
    assert html.count("<td></td>") == 1  # target a has no (mine, natural) cell


def test_the_driver_records_what_a_cell_task_sent_back(tmp_path, monkeypatch):
    """A cell task's CellResult (no Ray here: a stand-in ray.get hands it over) reaches the
    record step: the probe's files land in the run directory, the measured result and cold
    flag go to regress_record.record, the worker's seconds into the outcome."""
    import sys
    from types import SimpleNamespace as NS

    from kvdiag.commands import regress_record
    from kvdiag.fleet import driver
    from kvdiag.fleet.cell import CellResult
    from kvdiag.record.results import RunExtras

    fleet = _fleet(tmp_path)
    got = CellResult(result="measured", cold=True, seconds=12.345, files={"probe.json": b"{}"}, pid=7)
    monkeypatch.setitem(sys.modules, "ray", NS(get=lambda ref: got))
    seen = {}

    def record(p, opts, measured, cold, timer):
        seen.update(measured=measured, cold=cold, seconds=timer.seconds)
        return NS(verdict=Verdict.PASS, summary=None, run_dir=tmp_path / "run",
                  extra=RunExtras(run_id="run-1"))

    monkeypatch.setattr(regress_record, "record", record)
    monkeypatch.setattr(driver, "worst_metric", lambda summary: "SQDR 0")
    monkeypatch.setattr(driver, "coverage_of", lambda summary: None)
    run = tmp_path / "cell"
    run.mkdir()
    outcome = driver._record(fleet, fleet.cells[0], NS(run=NS(path=run)), None, ref=object())
    assert (run / "probe.json").read_bytes() == b"{}"
    assert seen["measured"] == "measured" and seen["cold"] is True and seen["seconds"] >= 12.345
    assert (outcome.run_id, outcome.seconds, outcome.verdict) == ("run-1", 12.35, Verdict.PASS)
