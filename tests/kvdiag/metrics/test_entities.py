"""The free-text fact check: each kind of entity is found, and an answer that changes any one
of the reference's entities fails; a reference without entities has nothing to check."""

from __future__ import annotations

import math

import pytest

from kvdiag.metrics.entities import Entity, check, entities, pipeline_name

REFERENCE = ('On October 11, 2019, Northwind Traders booked $66.0 million (17% up) in Lisbon, '
             'as "The Quiet Ledger" reports.\n\n```python\ndef quarter_of(y, u):\n    return y / u\n```\n'
             'Call `net_margin` before 2024-03-05.')


def test_every_kind_is_found():
    found = entities(REFERENCE, None)
    assert {Entity("date", "october 11 2019"), Entity("date", "2024-03-05"), Entity("number", "$66.0"),
            Entity("number", "17%"), Entity("title", "the quiet ledger"), Entity("code", "quarter_of"),
            Entity("code", "net_margin"), Entity("name", "northwind traders"),
            Entity("name", "lisbon")} <= found
    assert not {e for e in found if e.text in ("def", "return", "call", "on", "quiet ledger")}


@pytest.mark.parametrize("old, new", [("$66.0", "$66.9"), ("October 11", "October 12"),
                                      ("quarter_of", "quarter_at"), ("Quiet Ledger", "Quiet Letter"),
                                      ("Lisbon", "Porto"), ("17%", "71%")])
def test_a_changed_entity_fails(old, new):
    assert check(REFERENCE, REFERENCE, None).passed == 1.0
    result = check(REFERENCE, REFERENCE.replace(old, new), None)
    assert result.passed == 0.0 and result.missing


def test_prose_may_change_around_the_entities():
    answer = REFERENCE.replace("booked", "reported").replace("reports", "says")
    assert check(REFERENCE, answer, None).passed == 1.0


def test_nothing_to_check():
    assert math.isnan(check("yes, that is right.", "no", None).passed)
    assert math.isnan(check(None, "x", None).passed) and entities(float("nan"), None) == set()


def test_the_pipeline_is_named():
    assert "rule-based" in pipeline_name(None)
    assert pipeline_name("auto")  # the trained pipeline where installed, else the rules
