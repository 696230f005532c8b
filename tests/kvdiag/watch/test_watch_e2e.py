"""kvdiag watch end to end: a real `kvdiag serve` behind a real `kvdiag watch` subprocess,
ordinary chat clients (kvdiag.watch.clients: a shared document, uneven turns, half of them
streaming) through the proxy. The healthy cache is judged clean with nothing left out; a
key-coverage fault shows as over-hits; bad input exits 2 at once; a cut stream and a
killed upstream invent nothing, and the proxy judges again once the upstream is back."""

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from kvdiag.watch.clients import WORDS, run_clients
from kvdiag.watch.log import read_watch
from tests.kvdiag import serving
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

SERVE = ("--num-blocks", "120", "--max-num-seqs", "16", "--max-model-len", "2048")


def watching(upstream: str, path, *extra: str):
    """The proxy as these tests run it: no warm-up (the server is theirs and fresh), 2 s windows."""
    return serving.watching(upstream, "--file", str(path), "--warmup", "0", "--window", "2", *extra)


def settle(url: str, timeout: float = 20.0) -> dict:
    """The proxy's status once its queue is empty and no twin is running."""
    for _ in range(int(timeout * 10)):
        status = httpx.get(url + "/kvdiag/status", timeout=5).json()
        if status["queue"] == 0 and status["twins_running"] == 0 and status["in_flight"] == 0:
            return status
        time.sleep(0.1)
    raise AssertionError(f"the watch never settled: {status}")


def watch_metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/kvdiag/metrics", timeout=5).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def watch_report(path) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "kvdiag", "watch", "report", str(path), "--json"],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads(r.stdout)


def tenants_through(upstream: str, path) -> tuple[dict, tuple[int, dict], list[dict]]:
    """8 chat clients x 4 rounds in 4 cache_salt tenants through a watch (no twins) in front
    of a real engine this test started (it holds nothing the proxy did not see: no warm-up
    needed): the proxy's metrics, `watch report`'s exit and JSON, the findings."""
    with watching(upstream, path, "--sample", "0", "--pool-tokens", "0") as url:
        traffic = asyncio.run(run_clients(url, "canary", clients=8, rounds=4, tenants=4))
        settle(url)
        metrics = watch_metrics(url)
    assert traffic.failed == 0 and traffic.requests == 32
    findings = [json.loads(line) for line in path.read_text().splitlines() if '"finding"' in line]
    return metrics, watch_report(path), findings


def assert_tenants_clean(watched: tuple[dict, tuple[int, dict], list[dict]]) -> None:
    """A healthy engine under tenants_through: (nearly) every request judged, no over-hit."""
    m, (code, out), findings = watched
    assert m["kvdiag_watch_requests_total"] == 32 and m["kvdiag_watch_judged_total"] >= 30
    assert m["kvdiag_watch_over_hits_total"] == 0 and not [f for f in findings if f["kind"] == "over_hit"]
    assert code == 0 and out["verdict"] == "pass", out


def assert_tenants_leak(watched: tuple[dict, tuple[int, dict], list[dict]]) -> None:
    """A salt left out of the key under tenants_through: over-hits, each above its bound."""
    m, (code, out), findings = watched
    over = [f for f in findings if f["kind"] == "over_hit"]
    assert m["kvdiag_watch_over_hits_total"] > 0 and over
    assert all(f["cached"] > f["bound"] for f in over)
    assert code == 1 and out["verdict"] == "fail", out


def test_a_healthy_cache_is_judged_clean_with_every_request_checked(tmp_path):
    path = tmp_path / "watch.jsonl"
    with served(*SERVE) as (upstream, _), watching(upstream, path, "--sample", "0.5",
                                                   "--budget", "20", "--seed", "1") as url:
        traffic = asyncio.run(run_clients(url, "canary", clients=8, rounds=4, quote_share=0))
        status = settle(url)
        m = watch_metrics(url)
    assert traffic.requests == 32 and traffic.streamed == 16 and traffic.failed == 0
    assert m["kvdiag_watch_requests_total"] == 32
    assert m["kvdiag_watch_judged_total"] + sum(
        v for k, v in m.items() if k.startswith("kvdiag_watch_unjudged_total")) == 32
    assert m["kvdiag_watch_judged_total"] >= 30  # streaming with usage is judged too
    assert m["kvdiag_watch_over_hits_total"] == 0
    assert m["kvdiag_watch_twins_reached_total"] > 0 and m["kvdiag_watch_twin_departures_total"] == 0
    assert status["twins"]["floor_pairs"] > 0
    code, out = watch_report(path)
    assert code == 0 and out["verdict"] == "pass", out
    assert read_watch(path).total("contaminated") == 0  # every isolated twin computed afresh
    text = path.read_text()
    assert not [w for w in WORDS if w in text]  # no prompt or answer text is written
    assert (tmp_path / "watch.html").read_text().count("<tr>") > 3


def test_a_key_coverage_fault_shows_as_over_hits_on_ordinary_traffic(tmp_path):
    path = tmp_path / "watch.jsonl"
    with served("--allocator", "key-omits:8-15", *SERVE) as (upstream, _), \
            watching(upstream, path, "--sample", "0") as url:
        # one conversation at a time: which earlier blocks are cached when a request arrives
        # does not depend on how the server interleaved them (at 8 at once, 2 runs in 10
        # met no over-hit)
        asyncio.run(run_clients(url, "canary", clients=8, rounds=5, concurrency=1))
        settle(url)
        m = watch_metrics(url)
    assert m["kvdiag_watch_over_hits_total"] > 0
    code, out = watch_report(path)
    assert code == 1 and out["verdict"] == "fail"
    findings = [json.loads(line) for line in path.read_text().splitlines() if '"finding"' in line]
    over = [f for f in findings if f["kind"] == "over_hit"]
    assert over and all(f["cached"] > f["bound"] and f["request"] for f in over)
    assert all(0 <= f["lag"] < 300 for f in over)  # each written within 5 minutes of its request


def test_prompts_tokenized_in_the_proxy_are_judged_the_same(tmp_path):
    """--tokenizer: the proxy makes the ids with the model's own tokenizer and template and
    asks the upstream nothing; each count still equals the server's usage (so every request
    is judged), a healthy cache shows nothing, and a key-coverage fault shows as over-hits."""
    for allocator, concurrency in (("prefix-cache", None), ("key-omits:8-15", 1)):
        path = tmp_path / f"{allocator}.jsonl"
        with served("--allocator", allocator, *SERVE) as (upstream, _), \
                watching(upstream, path, "--sample", "0", "--tokenizer", "fixtures/canary") as url:
            traffic = asyncio.run(run_clients(url, "canary", clients=8, rounds=4,
                                              concurrency=concurrency))
            settle(url)
            m = watch_metrics(url)
        assert traffic.failed == 0 and m["kvdiag_watch_requests_total"] == 32
        assert m["kvdiag_watch_judged_total"] >= 30  # the counts matched the server's usage
        if allocator == "prefix-cache":
            assert m["kvdiag_watch_over_hits_total"] == 0
        else:
            assert m["kvdiag_watch_over_hits_total"] > 0
        assert read_watch(path).starts[0]["tokenizer"] == "fixtures/canary"


@pytest.mark.parametrize("args, words", [
    (["--upstream", "ftp://example"], "http:// or https://"),
    (["--upstream", "http://127.0.0.1:9", "--tokenizer", "docs"], "--tokenizer docs"),
    (["--upstream", "http://127.0.0.1:9", "--sample", "1.5"], "--sample"),
    (["--upstream", "http://127.0.0.1:9", "--listen", "nohost"], "--listen"),
])
def test_bad_input_exits_2_at_once(args, words):
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kvdiag", "watch", *args], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - start < 10  # (the interpreter's start-up is most of it)


def test_a_port_in_use_exits_2_naming_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "kvdiag", "watch", "--upstream",
                            "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and f"127.0.0.1:{port}" in r.stderr


def test_cut_streams_and_a_killed_upstream_invent_nothing(tmp_path):
    path = tmp_path / "watch.jsonl"
    with served(*SERVE) as (upstream, server), watching(upstream, path, "--sample", "0") as url:
        body = {"model": "canary", "max_tokens": 200, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "river stone " * 40}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # the client reads one event and goes away
        status = settle(url)
        assert status["in_flight"] == 0
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            server.kill()  # the upstream dies mid-stream: the client sees the stream break
            with pytest.raises(httpx.HTTPError):
                for _ in r.iter_lines():
                    pass
        dead = httpx.post(url + "/v1/chat/completions", json=body | {"stream": False}, timeout=30)
        assert dead.status_code == 502
        m = watch_metrics(url)
        assert m["kvdiag_watch_over_hits_total"] == 0 and m["kvdiag_watch_requests_total"] == 0
        # the upstream comes back on its address, its cache empty: the same proxy relays and
        # judges again, and what it indexed before the restart invents no finding
        with served(*SERVE, port=int(upstream.rsplit(":", 1)[1])):
            back = asyncio.run(run_clients(url, "canary", clients=2, rounds=2))
            settle(url)
            m = watch_metrics(url)
    assert back.failed == 0 and back.requests == 4
    assert m["kvdiag_watch_requests_total"] == 4 and m["kvdiag_watch_judged_total"] >= 3
    assert m["kvdiag_watch_over_hits_total"] == 0
    assert '"finding"' not in path.read_text()
