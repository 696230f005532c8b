"""`kvdiag serve` under hostile input and departing clients, as a real subprocess on
loopback: OpenAI-shaped 4xx for every input fault, a body limit, an API key, and aborts
that free KV blocks when a client disconnects."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

KEY = "kvdiag-test-key-3f9a"  # a made-up key, for the env var
FLAG_KEY = "kvdiag-flag-key-77c1"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT, CMPL, TOK = "/v1/chat/completions", "/v1/completions", "/tokenize"
LIMIT = 1 << 20


@pytest.fixture(scope="module")
def server():
    with served("--num-blocks", "600", "--max-model-len", "2048", "--max-body-bytes", str(LIMIT),
                env={"KVDIAG_API_KEY": KEY}) as (url, proc):
        yield url, proc


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server[0], headers=AUTH, timeout=60) as c:
        yield c


def _metric(client, name: str) -> float:
    lines = client.get("/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name))


def _body(path: str, text: bytes) -> bytes:
    if path == CHAT:
        return b'{"model":"canary","max_tokens":2,"messages":[{"role":"user","content":' + text + b"}]}"
    return b'{"model":"canary","max_tokens":2,"prompt":' + text + b"}"


def _assert_openai_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    return err["message"]


@pytest.mark.parametrize("path", [CHAT, CMPL, TOK])
@pytest.mark.parametrize("text", [b'"a\\ud800b"', b'"a\\udc00b"', b'"a\xed\xa0\x80b"', b'"a\xff\xfeb"'],
                         ids=["escaped-high-surrogate", "escaped-low-surrogate", "raw-surrogate", "bad-utf8"])
def test_unencodable_text_gets_openai_400(client, path, text):
    r = client.post(path, content=_body(path, text), headers={"content-type": "application/json"})
    assert "not valid JSON" in _assert_openai_error(r, 400)
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("path", [CHAT, CMPL, TOK])
def test_deep_nesting_gets_openai_400(client, path):
    body = b'{"model":"canary","prompt":' + b"[" * 5000 + b"]" * 5000 + b"}"
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert "recursion" in _assert_openai_error(r, 400)


def test_a_valid_surrogate_pair_is_still_text(client):
    r = client.post(TOK, content=b'{"model":"canary","prompt":"a \\ud83d\\ude00 b"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["count"] >= 2


def test_unknown_path_and_method_use_the_openai_shape(client):
    _assert_openai_error(client.get("/v1/nothing-here"), 404)
    _assert_openai_error(client.get(CMPL), 405)


def test_oversized_bodies_get_413_while_health_answers(client, server):
    huge = _body(CMPL, b'"' + b"bado " * (4 * LIMIT // 5) + b'"')  # 4 MiB, Content-Length
    results = {}

    def send():
        results["declared"] = client.post(CMPL, content=huge, headers={"content-type": "application/json"})
        chunks = (huge[i:i + 65536] for i in range(0, len(huge), 65536))  # chunked: no length
        results["chunked"] = client.post(CMPL, content=chunks, headers={"content-type": "application/json"})

    sender = threading.Thread(target=send)
    sender.start()
    health = []
    while sender.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(server[0] + "/health", timeout=30).status_code == 200
        health.append(time.perf_counter() - t0)
    sender.join()
    for r in results.values():
        assert "--max-body-bytes" in _assert_openai_error(r, 413)
    assert max(health) < 5.0, health  # loose: the machine is shared; the goal (< 1 s) is benchmarked
    # under the limit but far over max_model_len: a 400 after a prefix was tokenized
    big = _body(CMPL, b'"' + b"bado " * (LIMIT // 6) + b'"')
    assert "max_model_len" in _assert_openai_error(
        client.post(CMPL, content=big, headers={"content-type": "application/json"}), 400)


def test_api_key_guards_all_but_health_and_metrics(server):
    url = server[0]
    for method, path in [("GET", "/v1/models"), ("POST", CHAT), ("POST", CMPL), ("POST", TOK),
                         ("POST", "/detokenize"), ("POST", "/reset_prefix_cache")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, url + path, json={}, headers=headers)
            assert "API key" in _assert_openai_error(r, 401)
    assert httpx.get(url + "/health").status_code == 200
    assert "vllm:kv_cache_usage_perc" in httpx.get(url + "/metrics").text
    assert httpx.get(url + "/v1/models", headers=AUTH).status_code == 200


def test_api_key_flag_works_and_is_never_logged(tmp_path):
    with served("--max-model-len", "2048", "--api-key", FLAG_KEY) as (url, proc):
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {FLAG_KEY}"}).status_code == 200
    output = proc.stdout.read()
    assert "API key required" in output and FLAG_KEY not in output


def test_help_says_which_endpoints_stay_open():
    from typer.testing import CliRunner

    from kvdiag.cli import app

    text = " ".join(CliRunner().invoke(app, ["serve", "--help"], terminal_width=200).output.split())
    assert "KVDIAG_API_KEY" in text and "--max-body-bytes" in text
    assert "/health and /metrics" in text and "stay open" in text


def _wait_idle(client, aborted_before: float, timeout: float = 30.0) -> float:
    """Seconds until the abort is counted and no request holds a KV block."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if (_metric(client, "kvdiag_requests_aborted_total") > aborted_before
                and _metric(client, "vllm:kv_cache_usage_perc") == 0
                and _metric(client, "vllm:num_requests_running") == 0):
            return time.perf_counter() - t0
        time.sleep(0.02)
    raise AssertionError("the request was not aborted")


# the canary repeats "kefu" after this prompt until max_tokens: minutes of work if not aborted
LONG = {"model": "canary", "prompt": "bado kefu", "max_tokens": 1500}


def test_a_cut_stream_is_aborted_and_frees_its_blocks(client):
    before = _metric(client, "kvdiag_requests_aborted_total")
    with client.stream("POST", CMPL, json=LONG | {"stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                assert _metric(client, "vllm:kv_cache_usage_perc") > 0  # the request holds blocks
                break  # closing the line iterator closes the connection: the client is gone
    _wait_idle(client, before)


def test_a_disconnected_plain_request_is_aborted(client, server):
    before = _metric(client, "kvdiag_requests_aborted_total")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up: its connection closes
        httpx.post(server[0] + CMPL, json=LONG, headers=AUTH, timeout=httpx.Timeout(30, read=1.0))
    _wait_idle(client, before)
    done = client.post(CMPL, json=LONG | {"max_tokens": 4}).json()  # the server still serves
    assert done["usage"]["completion_tokens"] == 4


@pytest.mark.slow
def test_hostile_burst_gives_no_5xx_and_aborts_every_cut_stream():
    """A smaller serve_hostile burst: mixed valid and hostile requests, 20 MB bodies, cut streams."""
    from benchmarks.serve_hostile import hostile

    with served("--max-num-seqs", "16", "--max-model-len", "2048") as (url, proc):
        r = asyncio.run(hostile(url, proc.pid, n=72, concurrency=16, huge_mb=20, cuts_after=2))
    assert r["n_5xx"] == 0 and r["n_transport_errors"] == 0, r["statuses"]
    assert r["statuses"].get(413, 0) > 0 and r["statuses"].get(200, 0) > 0
    assert r["cut_streams"] > 0 and r["aborted"] >= r["cut_streams"]
    assert len(r["abort_s"]) == 2 and max(r["abort_s"]) < 5.0  # each later cut is aborted too
    assert r["kv_usage_after"] <= r["kv_usage_before"]
    assert r["health_max_s"] < 5.0  # loose: a loaded 2-core machine; the benchmark prints p99
