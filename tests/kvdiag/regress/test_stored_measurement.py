"""Baseline files and summaries written when a measurement was a plain dict (rounds as
string-keyed rows) load into the typed models (CaseMeasurement, RoundMeasurement), and save
back as the same JSON; the readers (BRAI, JUnit, history) take the typed objects."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.record.summary_rows import CaseMeasurement, RegressBlock, RoundMeasurement
from kvdiag.regress import baselines as B
from kvdiag.regress import history as H
from kvdiag.regress.compare import compare
from kvdiag.regress.junit import junit_xml
from kvdiag.regress.keys import BaselineKey
from kvdiag.regress.measure import CaseBrai, brai_against

KEY = {"engine": "reference", "engine_version": "0.1.0", "model": "canary-397f8e10", "suite": "smoke",
       "suite_sha": "0123abcd", "flags": {"block_size": 16, "device": "cpu", "enable_prefix_caching": True}}


def _old_round(n: int, rate: float = 1.0, foreign: int = 0) -> dict:
    return {"round": n, "fact_check_pass_rate": rate, "bleu4": 100.0, "block_reuse_rate": 0.5,
            "attention_leakage": None, "divergence_ratio": 0.0, "foreign_slots": foreign,
            "unwritten_slots": 0, "nonfinite_logits": 0}


OLD_MEASUREMENT = {"trigger": {"series": "reference:guarded", "sqdr": 0.0, "block_reuse_rate": 0.5,
                               "attention_leakage": None, "divergence_ratio": 0.0, "requests": 12,
                               "rounds": [_old_round(n) for n in (1, 2, 3)]}}


def _old_file(path) -> dict:
    data = {"schema": 1, "baselines": [{
        "key": KEY, "key_id": BaselineKey.from_dict(KEY).id, "target": "reference:guarded",
        "run_id": "guarded", "created": "2026-01-05T03:00:00+00:00", "signature": "kvdiag:0.1.0|x",
        "cases": ["trigger"], "measurement": copy.deepcopy(OLD_MEASUREMENT)}]}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def test_an_older_baseline_file_loads_typed_and_saves_unchanged(tmp_path):
    path = tmp_path / "baselines.json"
    data = _old_file(path)
    (baseline,) = B.load(path)
    m = baseline.measurement["trigger"]
    assert isinstance(m, CaseMeasurement) and m.series == "reference:guarded" and m.requests == 12
    assert [r.round for r in m.rounds] == [1, 2, 3] and isinstance(m.rounds[0], RoundMeasurement)
    assert m.rounds[0].foreign_slots == 0 and type(m.rounds[0].foreign_slots) is int
    assert m.rounds[0].attention_leakage is None and m.rounds[0].fact_check_pass_rate == 1.0
    assert B.find(path, BaselineKey.from_dict(KEY), ["trigger"]) == baseline
    B.save(tmp_path / "again.json", [baseline])
    assert json.loads((tmp_path / "again.json").read_text()) == data


def test_a_baseline_missing_a_round_number_is_no_baseline_file(tmp_path):
    path = tmp_path / "baselines.json"
    data = _old_file(path)
    del data["baselines"][0]["measurement"]["trigger"]["rounds"][1]["round"]
    path.write_text(json.dumps(data))
    with pytest.raises(KvdiagError, match=r"not a kvdiag baseline file \(.*rounds\.1\.round"):
        B.load(path)


def test_an_older_summary_regress_block_loads_typed():
    block = RegressBlock.model_validate({
        "run_id": "buggy", "target": "reference:buggy", "verdict": "fail", "key": KEY, "key_id": "k",
        "tolerances": {"sqdr": 0.005}, "measurement": copy.deepcopy(OLD_MEASUREMENT),
        "brai": {"trigger": 0.0}, "baseline": None, "regressed": {"foreign_slots": [3]},
        "ground_truth_failures": [], "failed_checks": [
            {"case": "trigger", "metric": "foreign_slots", "round": 3, "value": 2, "baseline": 0,
             "limit": 0, "passed": False, "message": "trigger: round 3: foreign_slots = 2"}]})
    assert block.measurement["trigger"].rounds[2].round == 3
    assert block.failed_checks[0].round == 3 and block.key.flags["block_size"] == 16
    assert block.model_dump(mode="json")["measurement"] == OLD_MEASUREMENT


def test_brai_junit_and_history_read_the_typed_objects(tmp_path):
    base = {c: CaseMeasurement.model_validate(m) for c, m in OLD_MEASUREMENT.items()}
    run = copy.deepcopy(OLD_MEASUREMENT)
    run["trigger"]["rounds"][2] = _old_round(3, rate=0.5, foreign=4)
    run["trigger"]["block_reuse_rate"] = 0.6
    run["trigger"]["rounds"][0]["block_reuse_rate"] = None
    measured = {c: CaseMeasurement.model_validate(m) for c, m in run.items()}
    brais = brai_against(measured, base)
    assert isinstance(brais["trigger"], CaseBrai) and brais["trigger"].brai == pytest.approx(0.1)
    assert sorted(brais["trigger"].rounds) == [2, 3]  # round 1's reuse was not measured
    assert brai_against(measured, None) == {"trigger": CaseBrai()}

    checks = compare(measured, base)
    failed = [c for c in checks if not c.passed]
    assert {(c.metric, c.round) for c in failed} == {("fact_check_pass_rate", 3), ("foreign_slots", 3),
                                                     ("brai", None)}
    suite = ET.fromstring(junit_xml("smoke", "reference:buggy", checks)).find("testsuite")
    assert suite.get("failures") == "3"
    messages = {tc.get("name"): tc.find("failure") for tc in suite.iter("testcase")}
    assert messages["trigger/foreign_slots"].get("message") == "foreign_slots regressed in trigger: rounds [3]"
    assert messages["trigger/bleu4"] is None

    history = tmp_path / "history.sqlite"
    H.append(history, {"run_id": "buggy", "created": "2026-01-12T03:00:00+00:00", "suite": "smoke",
                       "target": "reference:buggy", "verdict": "fail"}, [], failed)
    con = H.connect(history, create=False)
    try:
        rows = con.execute("SELECT metric, round, value, limit_value FROM checks ORDER BY metric").fetchall()
    finally:
        con.close()
    assert rows == [("brai", None, pytest.approx(0.1), pytest.approx(0.05)),
                    ("fact_check_pass_rate", 3, 0.5, pytest.approx(0.98)), ("foreign_slots", 3, 4.0, 0.0)]
