"""Suites load into validated dataclasses; malformed ones fail naming the file and the key."""

import math

import pytest

from kvdiag.errors import SuiteError
from kvdiag.planning.suites import load_suite


def test_bundled_suites_load():
    reproduce = load_suite("reproduce")
    assert [c.name for c in reproduce.select(None)] == ["trigger"]
    assert {c.name for c in reproduce.select("ablations")} == {"no-caching", "no-jump", "uniform", "big-pool"}
    trigger = reproduce.case("trigger")
    assert trigger.sessions == 16 and trigger.rounds >= 12 and trigger.boundary == 4096
    assert math.isnan(trigger.recycled_block_fill)
    long = reproduce.case("long")
    assert long.sessions == 32 and long.boundary == 8192
    assert load_suite("smoke").case("trigger").boundary == 1024


@pytest.mark.parametrize("text,key", [
    ("name: x\ncases: []\n", "cases"),
    ("cases: [{name: a}]\n", "name"),
    ("name: x\ncases: [{name: a, sessions: many}]\n", "cases[0].sessions"),
    ("name: x\ncases: [{name: a, ask_new: true}]\n", "cases[0].ask_new"),
    ("name: x\ncases: [{name: a, start_range: [5, x]}]\n", "cases[0].start_range[1]"),
    ("name: x\ndefaults: {max_think: \"9\"}\ncases: [{name: a}]\n", "defaults.max_think"),
    ("name: x\ncases: [{name: a, condtion: trigger}]\n", "cases[0].condtion"),
    ("name: x\ncases: [{name: a, condition: sideways}]\n", "cases[0].condition"),
    ("name: x\nallocators: [nope]\ncases: [{name: a}]\n", "allocators"),
    ("name: x\nstyle: poetry\ncases: [{name: a}]\n", "style"),
    ("name: x\ndefaults: {rounds: 0}\ncases: [{name: a}]\n", "defaults.rounds"),
    ("name: x\ncases: [{name: a, start_range: [5, 1]}]\n", "cases[0].start_range"),
    ("name: x\ncases: [{name: a}, {name: a}]\n", "cases"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_malformed_suites_name_file_and_key(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    message = str(e.value)
    assert str(path) in message and key in message and "\n" not in message


def test_missing_suite_lists_the_bundled_ones():
    with pytest.raises(SuiteError, match="bundled suites: .*reproduce"):
        load_suite("no-such-suite")
