"""The on-disk cache of the contiguous reference: a second run reads it instead of
recomputing and yields the same records; use_cache=False bypasses it; a corrupt or foreign
file is recomputed, never a crash. Real engine, real canary, a small smoke-suite plan."""

from __future__ import annotations

import json

import pytest

from kvdiag.paths import CANARY
from kvdiag.planning.plan import plan_case
from kvdiag.planning.suites import load_suite, resolve_suite_path, with_overrides
from kvdiag.runners.reference import cache as reference_cache
from kvdiag.runners.reference.engine import run_case


@pytest.fixture(scope="module")
def checkpoint():
    from reference_engine.loader import load_checkpoint

    return load_checkpoint(CANARY)


def _plan(checkpoint, **overrides):
    suite = load_suite(resolve_suite_path("smoke"))
    case = with_overrides(suite.cases[0], sessions=2, rounds=2, **overrides)
    return plan_case(suite, case, checkpoint.tokenizer)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "kvdiag" / "reference"


def _forbid_compute(monkeypatch):
    import reference_engine.contiguous as ref

    def refuse(*_a, **_k):
        raise AssertionError("the contiguous reference was recomputed")

    monkeypatch.setattr(ref, "ContiguousEngine", refuse)


def _rows(result):
    return [r.as_dict() for r in result.records]


def test_second_run_hits_the_cache_with_identical_records(checkpoint, cache_home, monkeypatch):
    plan = _plan(checkpoint)
    ticks = []
    first = run_case(plan, checkpoint, [], progress=ticks.append)
    assert first.reference_cache == "miss"
    assert len(list(cache_home.glob("smoke-trigger-*.json"))) == 1
    with monkeypatch.context() as m:
        _forbid_compute(m)
        second = run_case(plan, checkpoint, [], progress=ticks.append)
    assert second.reference_cache == "hit"
    assert _rows(second) == _rows(first)
    assert sum(ticks) == 2 * 2 * 2  # progress counts cached turns too
    # another case shape is another key: computed, not read
    other = run_case(_plan(checkpoint, max_tokens=8), checkpoint, [])
    assert other.reference_cache == "miss"
    assert len(list(cache_home.glob("*.json"))) == 2


def test_bypass_neither_reads_nor_writes(checkpoint, cache_home, monkeypatch):
    plan = _plan(checkpoint)
    stored = run_case(plan, checkpoint, [])
    path = next(cache_home.glob("*.json"))
    before = path.stat().st_mtime_ns
    off = run_case(plan, checkpoint, [], use_cache=False)
    assert off.reference_cache == "off"
    assert path.stat().st_mtime_ns == before
    assert _rows(off) == _rows(stored)
    path.unlink()
    run_case(plan, checkpoint, [], use_cache=False)
    assert not list(cache_home.glob("*"))


def test_a_damaged_entry_is_recomputed_and_replaced(checkpoint, cache_home):
    plan = _plan(checkpoint)
    good = _rows(run_case(plan, checkpoint, []))
    path = next(cache_home.glob("*.json"))
    text = path.read_text()
    short = dict(json.loads(text), turns=json.loads(text)["turns"][:-1])
    damages = {"garbage": b"\x00\xffnot json", "truncated": text[: len(text) // 2].encode(),
               "wrong shape": json.dumps(short).encode(),
               "wrong key": json.dumps(dict(json.loads(text), key="0" * 64)).encode()}
    for damage, content in damages.items():
        path.write_bytes(content)
        again = run_case(plan, checkpoint, [])
        assert again.reference_cache == "miss", damage
        assert _rows(again) == good, damage
        assert json.loads(path.read_text()) == json.loads(text), damage  # rewritten whole


def test_an_unwritable_cache_directory_is_skipped(checkpoint, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    result = run_case(_plan(checkpoint), checkpoint, [])
    assert result.reference_cache == "miss" and len(result.records) == 2 * 2
    assert reference_cache.cache_dir().parent.parent == blocker
