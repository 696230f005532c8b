"""Fact-check on hand-written answers, in both styles (rules: kvdiag.metrics.factcheck)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from kvdiag.metrics.factcheck import FactChecker, FactCheckPassRate
from kvdiag.metrics.triples import canonical_value, values_equal


@dataclass(frozen=True)
class Fact:  # the shape FactChecker reads; kvdiag.facts.Fact has these fields
    entity: str
    relation: str
    value: str


NATURAL_KB = (Fact("Acme Corp", "revenue", "$4.2 billion"),
              Fact("Acme Corp", "net income", "$0.8 billion"),
              Fact("Globex Inc", "revenue", "$3.1 billion"),
              Fact("Patient P-17", "HbA1c", "7.1 %"),
              Fact("Tenant", "notice period", "30 days"))
CANARY_KB = (Fact("acme", "revenue", "4.2 bn"), Fact("acme", "net_income", "0.8 bn"),
             Fact("globex", "revenue", "3.1 bn"))
REVENUE, INCOME, HBA1C, NOTICE = NATURAL_KB[0], NATURAL_KB[1], NATURAL_KB[3], NATURAL_KB[4]
C_REVENUE, C_INCOME = CANARY_KB[0], CANARY_KB[1]


@pytest.fixture(scope="module")
def natural() -> FactChecker:
    return FactChecker(NATURAL_KB, "natural")


@pytest.fixture(scope="module")
def canary() -> FactChecker:
    return FactChecker(CANARY_KB, "canary")


@pytest.mark.parametrize("answer, asked, passed, reason", [
    ("Acme Corp reported revenue of $4.2 billion.", (REVENUE,), True, "ok"),
    ("Acme Corp's revenue was $4.20 billion in 2023.", (REVENUE,), True, "ok"),
    ("$4.2 billion.", (REVENUE,), True, "ok"),  # entity and relation from the question
    ("Acme Corp reported revenue of $5.1 billion.", (REVENUE,), False, "wrong value"),
    ("Acme Corp reported revenue of $3.1 billion.", (REVENUE,), False, "wrong value"),
    ("Globex Inc reported revenue of $4.2 billion.", (REVENUE,), False, "missing"),
    ("Initech reported revenue of $4.2 billion.", (REVENUE,), False, "missing"),
    ("Acme Corp reported revenue of $4.2 billion and net income of $0.8 billion.",
     (REVENUE, INCOME), True, "ok"),
    ("Acme Corp made $4.2 billion in revenue and $0.8 billion in net income.",
     (REVENUE, INCOME), True, "ok"),
    ("Revenue was $4.2 billion. Net income came to $0.9 billion.",
     (REVENUE, INCOME), False, "wrong value for Acme Corp / net income"),
    ("Acme Corp reported revenue of $4.2 billion.", (REVENUE, INCOME), False, "missing"),
    ("I think Acme Corp reported revenue of $4.2 billion.", (REVENUE,), False, "hedged"),
    ("Revenue was maybe $4.2 billion.", (REVENUE,), False, "hedged"),
    ("I'm not sure.", (REVENUE,), False, "hedged"),
    ("", (REVENUE,), False, "empty answer"),
    ("  <|im_end|>", (REVENUE,), False, "empty answer"),
    ("Patient P-17 had an HbA1c of 7.1%.", (HBA1C,), True, "ok"),
    ("The tenant's notice period is 30 days.", (NOTICE,), True, "ok"),
    ("The tenant's notice period is 60 days.", (NOTICE,), False, "'60 days'"),
])
def test_natural(natural: FactChecker, answer, asked, passed, reason) -> None:
    result = natural.check(answer, asked)
    assert (result.passed, reason in result.reason) == (passed, True), result


@pytest.mark.parametrize("answer, asked, passed, reason", [
    ("4.2 bn", (C_REVENUE,), True, "ok"),
    ("4.2 bn <|im_end|>", (C_REVENUE,), True, "ok"),
    ("3.1 bn", (C_REVENUE,), False, "wrong value"),  # another entity's value
    ("5.5 bn", (C_REVENUE,), False, "missing"),  # a value the KB does not hold
    ("globex revenue 4.2 bn", (C_REVENUE,), False, "missing"),  # wrong entity, stated
    ("acme revenue 4.2 bn", (C_REVENUE,), True, "ok"),
    ("4.2 bn 0.8 bn", (C_REVENUE, C_INCOME), True, "ok"),
    ("0.8 bn 4.2 bn", (C_REVENUE, C_INCOME), False, "wrong value"),  # order is the rule
    ("4.2 bn", (C_REVENUE, C_INCOME), False, "missing: acme / net_income"),
    ("4.2 bn 0.8 bn", (C_REVENUE,), False, "unrecognised tokens: 0.8 bn"),
    ("4.2 bn <unk>", (C_REVENUE,), False, "unrecognised tokens"),
    ("<unk>", (C_REVENUE,), False, "missing"),
    ("maybe 4.2 bn", (C_REVENUE,), False, "hedged"),
    ("", (C_REVENUE,), False, "empty answer"),
    (None, (C_REVENUE,), False, "empty answer"),
])
def test_canary(canary: FactChecker, answer, asked, passed, reason) -> None:
    result = canary.check(answer, asked)
    assert (result.passed, reason in result.reason) == (passed, True), result


def test_triples_are_reported(natural: FactChecker) -> None:
    result = natural.check("Acme Corp reported revenue of $4.2 billion.", REVENUE)
    assert [tuple(t) for t in result.triples] == [("Acme Corp", "revenue", "$4.2 billion")]


def test_values_compare_canonically() -> None:
    assert canonical_value("$4.20 Billion") == ("$", "4.2", "bn")
    assert values_equal("4.2 bn", "$4.2 billion") and values_equal("1,200", "1200")
    assert values_equal("12 per cent", "12%") and not values_equal("$4.2 bn", "€4.2 bn")
    assert not values_equal("4.2 bn", "4.2 m")


def test_style_and_model_options(tmp_path: Path) -> None:
    import spacy

    with pytest.raises(ValueError, match="style"):
        FactChecker(NATURAL_KB, "poetry")
    missing = FactChecker(NATURAL_KB, "natural", spacy_model="en_core_web_nonexistent")
    assert "not available" in missing.note and missing.check("$4.2 billion", REVENUE).passed
    saved = spacy.blank("en")
    saved.add_pipe("sentencizer")
    saved.to_disk(tmp_path / "model")  # stands in for an installed model such as en_core_web_sm
    loaded = FactChecker(NATURAL_KB, "natural", spacy_model=str(tmp_path / "model"))
    assert loaded.note == "" and loaded.nlp.pipe_names == ["sentencizer", "entity_ruler"]
    assert loaded.check("Acme Corp reported revenue of $4.2 billion.", REVENUE).passed


def test_aliases_and_kb_object() -> None:
    class KB:
        facts = NATURAL_KB

    checker = FactChecker(KB(), "natural", aliases={"revenue": ["sales"], "Acme Corp": ["Acme"]})
    assert checker.check("Acme's sales were $4.2 billion.", REVENUE).passed


def test_pass_rate_metric_skips_recitations() -> None:
    rows = pd.DataFrame({"fact_check_pass": [1.0, 0.0, float("nan"), 1.0]})
    assert FactCheckPassRate().compute(rows) == pytest.approx(2 / 3)
