"""summary.json's blocks every kind shares, typed: the environment (kvdiag.record.environment)
and each case's SQDR and BRAI (`by_case`, CaseMetrics) load from what older kvdiag wrote,
read by attribute and write back the same keys; judge_reference's details read as
SeriesFindings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.record.environment import Environment, GitCommit, describe_environment
from kvdiag.record.kinds import parse_summary
from kvdiag.record.summary import ReproduceSummary
from kvdiag.record.summary_rows import CaseMetrics, SeriesFindings

pytestmark = pytest.mark.unit

OLD = Path(__file__).resolve().parents[2] / "fixtures" / "summaries" / "probe-vllm-ref-undercount-1d8c4e8.json"
FIELDS = {"signature": "sig", "suite": "s", "verdict": "pass", "suite_path": "s.yaml",
          "cases": ["trigger"], "targets": ["reference"], "allocators": ["guarded"], "model": "m",
          "device": "cpu", "engine_log": {}, "seconds": {}, "gates": {}, "faults": {}}
BY_CASE = {"trigger": {"sqdr": {"reference/guarded": 0.0, "reference/buggy": 0.25},
                       "brai": {"reference/guarded": 0.0, "reference/buggy": None}},
           "control": {"sqdr": {}, "brai": {}}}


def test_an_older_environment_loads_and_writes_back_what_it_held():
    data = json.loads(OLD.read_text())
    env = parse_summary(data).environment
    assert env.packages == {"kvdiag": "0.1.0", "torch": "2.13.0+cpu"} and env.python == "3.11.7"
    assert env.git == GitCommit(commit="1d8c4e8", dirty=False) and env.cpu is None
    written = env.model_dump(mode="json")
    assert all(written[k] == v for k, v in data["environment"].items())


def test_an_environment_keeps_a_key_it_does_not_declare_and_an_empty_one_loads():
    env = Environment.model_validate({"python": "3.12.1", "cuda": "12.4"})
    assert env.model_dump(mode="json")["cuda"] == "12.4" and env.python == "3.12.1"
    empty = Environment.model_validate({})
    assert empty.packages == {} and empty.git is None


def test_this_machines_environment_round_trips_with_the_same_keys():
    env = describe_environment(engine=("vllm", "0.11.0"))
    data = json.loads(env.model_dump_json())
    assert list(data) == ["packages", "spacy_models", "python", "implementation", "platform",
                          "machine", "cpu", "cpu_count", "git"]
    assert data["packages"]["vllm"] == "0.11.0"
    assert json.loads(Environment.model_validate(data).model_dump_json()) == data


def test_by_case_reads_by_attribute_and_writes_back_the_same_json():
    s = ReproduceSummary(**FIELDS, by_case=BY_CASE)
    assert isinstance(s.by_case["trigger"], CaseMetrics)
    assert s.by_case["trigger"].sqdr["reference/buggy"] == 0.25 and s.by_case["trigger"].brai["reference/buggy"] is None
    written = json.loads(s.to_json())
    assert written["by_case"] == BY_CASE
    again = parse_summary(written)
    assert again.by_case == s.by_case and CaseMetrics.model_validate({}).sqdr == {}


def test_the_ablation_table_reads_each_cases_metrics():
    import pandas as pd

    from kvdiag.report.tables import ablation_table

    rows = pd.DataFrame([{"case": c, "series": "reference/buggy", "foreign_slots": 0,
                          "unwritten_slots": 0, "attention_leakage": 0.0, "attention_leakage_max": 0.0,
                          "fact_check_pass": 1.0, "output_text": "a b c", "reference_text": "a b c"}
                         for c in ("trigger", "missing")])
    table = ablation_table(rows, {c: CaseMetrics.model_validate(m) for c, m in BY_CASE.items()})
    assert table["SQDR"].tolist()[0] == 0.25 and pd.isna(table["SQDR"].tolist()[1])


def test_judge_reference_details_read_as_series_findings():
    from kvdiag.verdicts import judge_reference

    def row(allocator, foreign=0):
        return {"case": "c", "target": "reference", "allocator": allocator, "round": 1,
                "foreign_slots": foreign, "bleu4": 100.0 if not foreign else 80.0,
                "fact_check_pass_rate": 1.0, "attention_leakage": None, "brai": 0.0}

    judged = judge_reference([row("contiguous"), row("guarded"), row("buggy", foreign=40)],
                             [("c", False)], {"c": {"guarded": 5}})
    found = SeriesFindings.model_validate(judged.details)
    assert found.gates["c/guarded"].passed and found.gates["c/guarded"].failures == []
    assert found.faults["c/buggy"] and "c/buggy" not in found.gates
