"""kvdiag probe against `kvdiag serve` subprocesses: the guarded server passes, the buggy one
fails with the rounds named (and agrees with the in-process runner), a dead server exits 2,
a probe killed mid-run resumes from its rounds.jsonl, and so does one whose server died."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from tests.kvdiag.serving import (
    assert_died_and_kept,
    free_port,
    probe_until_server_dies,
    resumed_keys,
    served,
    sigkill_when,
    smoke_pool,
)

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def _server_args(allocator: str) -> list[str]:
    return ["--allocator", allocator, "--num-blocks", str(smoke_pool()), "--max-num-seqs", "16",
            "--recycled-block-fill", "nan", "--max-model-len", "2048", "--max-num-batched-tokens", "512",
            "--long-prefill-token-threshold", "128"]


def _probe(url: str, out, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvdiag", "probe", "--base-url", url, "--model", "canary",
            "--suite", "smoke", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    result = CliRunner().invoke(app, ["reproduce", "--suite", "smoke", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow  # ~75 s; the buggy server's probe below runs in the fast suite
def test_probe_passes_the_guarded_server(tmp_path, in_process):
    with served(*_server_args("guarded")) as (url, _):
        run = subprocess.run(_probe(url, tmp_path / "g", "--json", "--require", "all"), capture_output=True,
                             text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["verdict"] == "pass" and summary["corrupted_requests"] == 0
    # every event of a block's life reached, and the PASS says so; no top-k shift beyond the floor
    assert all(r["reached"] for r in summary["events"]) and len(summary["events"]) == 8
    assert "events reached: recycle, early-free, preemption" in summary["reason"]
    assert summary["topk"]["compared"] > 100 and summary["topk"]["departed"] == 0
    assert summary["isolation"] == "cache_salt"
    from tests.kvdiag.schema_util import assert_valid_summary

    assert_valid_summary(tmp_path / "g", "probe")
    assert summary["ground_truth"]["isolated"] > 0 and summary["ground_truth"]["contaminated"] == 0
    # the shared phase used the cache, and every hit the server counted was one the client's own
    # prompts allowed (the over-hit oracle). Not "most of every history": on the smoke pool, with a
    # 512-token step budget, prompts hold their blocks for several steps and preempted requests
    # query again, so recycling takes much of what the next round would have hit
    assert summary["server_prefix_cache"]["hit_rate"] > 0.1
    oracle = summary["key_coverage"]["oracle"]
    assert oracle["checked"] > 0 and oracle["over_hits"] == 0
    assert in_process["gates"]["trigger/guarded"]["passed"]  # the in-process runner agrees


@pytest.mark.slow  # ~2 min with its in-process twin
def test_probe_finds_corruption_on_the_buggy_server_and_resumes(tmp_path, in_process):
    """Resume, against the trigger's own traffic (what the in-process runner replays): the
    class-reaching additions (one-token twins, the spread system prompt) each cut how often
    this fault fires on a fresh server (docs/faults.md: 7-12 corrupted with both, 21-25
    without; one run of a killed-and-resumed default probe found none), so this test of
    resuming a failing probe does not rest on them."""
    out = tmp_path / "b"
    trigger_only = ("--no-twins", "--no-spread")
    with served(*_server_args("buggy")) as (url, _):
        proc = subprocess.Popen(_probe(url, out, *trigger_only), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        rounds = out.with_name(out.name + ".partial") / "rounds.jsonl"  # unfinished: not yet `out`
        sigkill_when(proc, lambda: rounds.exists() and len(rounds.read_text().splitlines()) >= 60,
                     "60 rounds", timeout=600)
        kept = [json.loads(line) for line in rounds.read_text().splitlines() if line.strip()]
        assert len(kept) >= 60 and not out.exists()
        at_kill = _queries(url)
        run = subprocess.run(_probe(url, out, *trigger_only, "--resume", str(out), "--json"),
                             capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    keys = [(r["phase"], r["session"], r["round"]) for r in rows]
    assert len(keys) == len(set(keys)) >= 2 * 16 * 12 + 4 * 12  # nothing asked twice
    assert summary["verdict"] == "fail" and summary["corruption_rounds"]
    assert all(1 <= n <= 12 for n in summary["corruption_rounds"])
    # the server's cache statistics cover the whole run, not only the resumed part: the
    # counters kept are those from before the first attempt's rounds
    kept_before = json.loads((out / "probe.json").read_text())["metrics_before"]
    assert kept_before["vllm:prefix_cache_queries_total"] < at_kill
    assert summary["server_prefix_cache"]["hit_rate"] is not None
    assert in_process["faults"]["trigger/buggy"]  # the in-process runner agrees


@pytest.mark.slow  # ~2 min: two servers and a whole smoke probe
def test_a_server_that_dies_mid_run_exits_2_and_the_probe_resumes(tmp_path):
    out = tmp_path / "p"
    with served(*_server_args("guarded")) as (url, proc):
        code, err, kept = probe_until_server_dies(_probe(url, out), out, proc.kill)
    assert_died_and_kept(code, err, url, kept, out)
    with served(*_server_args("guarded")) as (url, _):  # a new server (a new port)
        run = subprocess.run(_probe(url, out, "--resume", str(out), "--json"), capture_output=True,
                             text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["verdict"] == "pass"
    assert len(resumed_keys(out, kept)) >= 2 * 16 * 12 + 4 * 12


def _queries(url: str) -> float:
    """The server's prefix-cache query counter now."""
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total"):
            return float(line.split()[-1])
    raise AssertionError("no vllm:prefix_cache_queries_total in /metrics")


def test_probe_against_a_dead_server_exits_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(_probe(url, tmp_path / "d"), capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach" in lines[0]


def test_an_adapter_the_server_does_not_serve_exits_2_naming_it(tmp_path):
    with served(*_server_args("guarded"), "--lora-modules", "tenant-x") as (url, _):
        run = subprocess.run(_probe(url, tmp_path / "a", "--adapter", "canary-lora"),
                             capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not serve the adapter 'canary-lora'" in lines[0], lines
    assert "tenant-x" in lines[0]  # names what it does serve
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
