"""An isolation summary as kvdiag wrote it when its blocks were plain dicts loads into the
typed blocks (kvdiag.record.isolation_rows) and writes back the same JSON; a key since
dropped is ignored, and an empty block reads as the defaults; the plan block's defaults are
the runner's IsolationPlan's."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict

from kvdiag.record.isolation_rows import (
    IsolationCell,
    IsolationLeak,
    IsolationPlanBlock,
    IsolationServer,
)
from kvdiag.record.kinds import parse_summary
from kvdiag.record.summary import IsolationSummary
from kvdiag.runners.live.isolation_plan import IsolationPlan
from kvdiag.verdicts import Verdict


def _cell(config: str, cached: int, *, auc: float, p: float, content: bool, timing: bool,
          hit: bool) -> dict:
    return {"config": config, "length": 64, "trials": 6, "cached_correct_mean": cached,
            "cached_wrong_mean": 0, "cached_correct_max": cached, "cached_wrong_max": 0,
            "cached_correct_median": cached, "block_size": 16, "ttft_correct_median_s": 0.0123,
            "ttft_wrong_median_s": 0.0311, "auc": auc, "auc_ci95": [auc - 0.1, 1.0],
            "p_value": p, "exact_p": True, "hit": hit, "content_leak": content,
            "timing_leak": timing, "leaks": content or timing}


LEAKING = _cell("per-tenant", 64, auc=0.97, p=0.002, content=True, timing=True, hit=True)
OLD = {  # a failed audit's summary.json, keys as the dict-building code wrote them
    "signature": "kvdiag:0.1.0|engine:kvdiag-0.1.0|alloc:isolation|bs:16|model:canary-397f8e10|"
                 "suite:isolation|seed:1234",
    "suite": "isolation", "verdict": "fail",
    "reason": "per-tenant leaks at a 64-token prefix: AUC 0.97 (p=0.002), cached tokens correct "
              "64 vs wrong 0",
    "target": "http://127.0.0.1:8000", "model": "canary", "rounds": [], "sqdr": {}, "brai": {},
    "requests": 66, "leaks": [LEAKING],
    "isolation": {
        "server": {"block_size": 16, "block_size_source": "vllm:cache_config_info",
                   "max_model_len": 4096, "cached_tokens_source": "usage"},
        "plan": {"lengths": [64], "trials": 6, "warmup": 1, "max_requests": 2000,
                 "max_seconds": 900.0, "alpha": 0.01, "min_auc": 0.75, "seed": 1234,
                 "adapter": None, "suffix_tokens": 8,
                 "configurations": ["no-salt", "per-tenant", "same-salt"]},
        "cells": [_cell("no-salt", 64, auc=1.0, p=0.002, content=True, timing=True, hit=True),
                  LEAKING,
                  _cell("same-salt", 0, auc=0.5, p=1.0, content=False, timing=False, hit=False)],
        "exposure_leaks": True},
    "wall_seconds": 12.5, "command": "kvdiag isolation --base-url http://127.0.0.1:8000",
    "created": "2025-01-01T00:00:00Z", "schema_version": 3, "kind": "isolation",
    "environment": {},
}


def test_an_older_isolation_summary_loads_into_the_typed_blocks():
    summary = parse_summary(copy.deepcopy(OLD))
    assert type(summary) is IsolationSummary and summary.verdict is Verdict.FAIL
    iso = summary.isolation
    assert isinstance(iso.server, IsolationServer) and iso.server.block_size == 16
    assert iso.server.cached_tokens_source == "usage" and iso.server.max_model_len == 4096
    assert isinstance(iso.plan, IsolationPlanBlock)
    assert (iso.plan.lengths, iso.plan.alpha, iso.plan.seed) == ([64], 0.01, 1234)
    assert [type(c) for c in iso.cells] == [IsolationCell] * 3
    assert [(c.config, c.leaks, c.hit) for c in iso.cells] == [
        ("no-salt", True, True), ("per-tenant", True, True), ("same-salt", False, False)]
    assert iso.cells[1].auc_ci95 == [0.87, 1.0] and iso.exposure_leaks is True
    assert [type(c) for c in summary.leaks] == [IsolationLeak]
    assert summary.leaks[0].config == "per-tenant" and summary.leaks[0].content_leak is True
    # nothing was lost or retyped on the way: it writes back what it read (ints stay ints)
    written = json.loads(summary.to_json())
    newer = ("beyond_own_correct_max", "beyond_own_wrong_max")  # not measured then: None
    for cell in written["isolation"]["cells"] + written["leaks"]:
        assert [cell.pop(k) for k in newer] == [None, None]
    assert written["isolation"] == OLD["isolation"] and written["leaks"] == OLD["leaks"]
    assert isinstance(written["isolation"]["cells"][0]["cached_correct_max"], int)


def test_a_dropped_key_is_ignored_and_an_empty_block_reads_as_the_defaults():
    old = copy.deepcopy(OLD)
    old["isolation"]["cells"][0]["ttft_p90_s"] = 0.5  # a key no cell declares
    old["isolation"]["server"]["engine_hint"] = "vllm"
    assert parse_summary(old).isolation.cells[0].config == "no-salt"
    empty = parse_summary(OLD | {"isolation": {}, "leaks": []}).isolation
    assert (empty.cells, empty.exposure_leaks, empty.server.block_size) == ([], False, None)
    assert empty.plan.alpha == 0.01 and empty.plan.min_auc == 0.75


def test_the_plan_block_defaults_are_the_runners_plan_defaults():
    plan, block = asdict(IsolationPlan()), IsolationPlanBlock().model_dump()
    del plan["lengths"]  # None (auto) in the options; the block holds the lengths resolved
    assert {k: block[k] for k in plan} == plan and block["lengths"] == []
