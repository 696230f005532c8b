"""SQDR, first divergence, the per-round table and the summary.json parts."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvdiag.metrics.decay import first_divergence, per_round, series_name, sqdr, summarize


def records(case: str = "trigger", target: str = "reference") -> list[dict]:
    """2 sessions x 3 rounds for contiguous, guarded and buggy; buggy fails from round 2."""
    rows = []
    for allocator in ("contiguous", "guarded", "buggy"):
        for session in ("s0", "s1"):
            for r in (1, 2, 3):
                bad = allocator == "buggy" and r >= 2 and (session == "s1" or r == 3)
                recite = r == 2 and session == "s0"
                ref = [1, 2, 3, 4, 5]
                out = [1, 2, 9, 9, 9] if bad else ref
                hit = 0 if allocator == "contiguous" else (8 if allocator == "buggy" else 6)
                rows.append({
                    "case": case, "target": target, "allocator": allocator, "session": session,
                    "round": r, "kind": "recite" if recite else "question",
                    "prompt_tokens": 160, "cached_tokens": hit * 16, "blocks_needed": 10,
                    "blocks_hit": hit, "attention_leakage": 0.25 if bad else 0.0,
                    "attention_leakage_max": 0.5 if bad else 0.0,
                    "foreign_slots": 16 if bad else 0, "unwritten_slots": 0,
                    "guard_rejections": 1 if allocator == "guarded" else 0,
                    "nonfinite_logits": 0, "preemptions": 0,
                    "output_text": " ".join(f"w{t}" for t in out),
                    "reference_text": " ".join(f"w{t}" for t in ref),
                    "output_token_ids": out, "reference_token_ids": ref,
                    "first_divergence": first_divergence(out, ref),
                    "fact_check_pass": math.nan if recite else (0.0 if bad else 1.0),
                })
    return rows


def frame(*parts: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame([row for part in parts for row in part])
    df["first_divergence"] = df["first_divergence"].astype("Int64")
    return df


def test_sqdr() -> None:
    assert sqdr([1.0, 1.0, 1.0]) == 0.0
    assert sqdr([1.0, 0.5, 0.0, 0.0]) == pytest.approx(0.25)
    assert sqdr({1: 1.0, 2: math.nan, 3: 0.4}) == pytest.approx(0.2)
    assert sqdr({2: 0.5, 1: 1.0}) == pytest.approx(0.25)  # order of the mapping is irrelevant
    assert math.isnan(sqdr([math.nan, math.nan])) and math.isnan(sqdr([]))


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2 and first_divergence([], [7]) == 0
    assert first_divergence([], []) is None


@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12))
def test_first_divergence_is_the_common_prefix_length(a: list[int], b: list[int]) -> None:
    k = first_divergence(a, b)
    if k is None:
        assert a == b
    else:
        assert a[:k] == b[:k] and (k == min(len(a), len(b)) or a[k] != b[k])


def test_per_round() -> None:
    table = per_round(frame(records()))
    assert list(table["allocator"].unique()) == ["contiguous", "guarded", "buggy"]
    assert len(table) == 9 and list(table["round"][:3]) == [1, 2, 3]
    buggy = table[table["allocator"] == "buggy"].set_index("round")
    assert buggy.loc[1, "fact_check_pass_rate"] == 1.0
    assert buggy.loc[2, "fact_check_pass_rate"] == 0.0  # s0 recites in round 2: not checked
    assert buggy.loc[3, "fact_check_pass_rate"] == 0.0
    assert buggy.loc[1, "bleu4"] == 100.0 and buggy.loc[3, "bleu4"] < 100.0
    assert buggy.loc[2, "attention_leakage"] == pytest.approx(0.125)
    assert buggy.loc[2, "attention_leakage_max"] == 0.5
    assert buggy.loc[3, "foreign_slots"] == 32 and buggy.loc[2, "diverged_sessions"] == 1
    assert buggy.loc[1, "block_reuse_rate"] == pytest.approx(0.8)
    guarded = table[table["allocator"] == "guarded"]
    assert (guarded["guard_rejections"] == 2).all() and (guarded["bleu4"] == 100.0).all()
    with pytest.raises(ValueError, match="blocks_hit"):
        per_round(frame(records()).drop(columns=["blocks_hit"]))


def test_summarize_reference_run_is_json_and_keyed_by_allocator() -> None:
    df = frame(records(), records(case="no-caching"))
    summary = summarize(df)
    json.dumps(summary.fields(), allow_nan=False)  # strict JSON: NaN became null
    assert summary.main_case == "trigger" and set(summary.by_case) == {"trigger",
                                                                             "no-caching"}
    assert summary.sqdr == {"guarded": 0.0, "buggy": pytest.approx(1 / 3)}
    assert summary.brai == {"guarded": 0.0, "buggy": pytest.approx(0.2)}
    first = summary.rounds[0]
    for key in ("target", "allocator", "round", "block_reuse_rate", "attention_leakage",
                "bleu4", "fact_check_pass_rate", "foreign_slots", "guard_rejections", "case"):
        assert key in first
    assert len(summary.rounds) == 18
    for rec in summary.rounds:
        assert 0 <= rec["block_reuse_rate"] <= 1 and 0 <= rec["bleu4"] <= 100
    buggy = [r for r in summary.rounds if r["allocator"] == "buggy" and r["case"] == "trigger"]
    assert [r["brai"] for r in buggy] == [pytest.approx(0.2)] * 3
    assert summary.bleu_signature.startswith("nrefs:1|")


def test_summarize_probe_uses_targets_and_passed_expectation() -> None:
    probe = [r for r in records(target="http://127.0.0.1:8000/v1") if r["allocator"] == "buggy"]
    for r in probe:
        r["allocator"] = "server"
        r["attention_leakage"] = r["attention_leakage_max"] = math.nan
    reference = [r for r in records() if r["allocator"] == "contiguous"]
    summary = summarize(frame(reference, probe), expected_reuse={"trigger": 0.6})
    name = "http://127.0.0.1:8000/v1"
    assert series_name(name, "server") == name and series_name("reference", "buggy") == "buggy"
    assert set(summary.sqdr) == {name} and summary.brai[name] == pytest.approx(0.2)
    probe_rounds = [r for r in summary.rounds if r["target"] == name]
    assert all(r["attention_leakage"] is None for r in probe_rounds)
    assert summarize(frame(probe)).brai == {name: None}  # nothing to compare against
