"""The reference engine's OpenAI-compatible server, as a real subprocess on loopback."""

from __future__ import annotations

import httpx
import pytest

from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

FACT = "acmeREV usd four point two billion . bado kefu ask acmeREV"


@pytest.fixture(scope="module")
def server():
    with served("--allocator", "guarded", "--num-blocks", "600", "--max-model-len", "2048") as (url, _):
        yield url


def test_openai_client_completes_and_chats(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["canary"]
    chat = client.chat.completions.create(model="canary", messages=[{"role": "user", "content": FACT}],
                                          max_tokens=16, logprobs=True, top_logprobs=2)
    assert chat.choices[0].message.content.strip() == "usd four point two billion"
    assert chat.choices[0].finish_reason == "stop"
    assert chat.choices[0].logprobs.content[0].top_logprobs[0].logprob == pytest.approx(0.0, abs=1e-3)
    assert chat.usage.completion_tokens == 6
    text = client.completions.create(model="canary", prompt="<|im_start|>user " + FACT + "<|im_end|><|im_start|>assistant",
                                     max_tokens=16)
    assert text.choices[0].text.strip() == "usd four point two billion"
    stream = client.chat.completions.create(model="canary", messages=[{"role": "user", "content": FACT}],
                                            max_tokens=16, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream]
    assert "".join(pieces).strip() == "usd four point two billion"


def test_tokenize_detokenize_and_cache_salt(server):
    messages = [{"role": "user", "content": FACT}]
    tok = httpx.post(server + "/tokenize", json={"model": "canary", "messages": messages}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 2048
    back = httpx.post(server + "/detokenize", json={"model": "canary", "tokens": tok["tokens"]}).json()
    assert "acmeREV" in back["prompt"]
    long = [{"role": "user", "content": " ".join(["bado kefu"] * 40) + " " + FACT}]
    body = {"model": "canary", "messages": long, "max_tokens": 8}
    first = httpx.post(server + "/v1/chat/completions", json=body).json()
    again = httpx.post(server + "/v1/chat/completions", json=body).json()
    salted = httpx.post(server + "/v1/chat/completions", json=body | {"cache_salt": "tenant-a"}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64  # the cache hit
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # salt: another cache
    metrics = httpx.get(server + "/metrics").text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "kvdiag_guard_rejections_total", "kvdiag_foreign_slots_total"):
        assert name in metrics


@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
    ({"model": "canary", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400),
    ({"model": "canary", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, 400),
    ({"model": "canary", "messages": [{"role": "user", "content": "bado " * 3000}]}, 400),
    ({"model": "canary", "messages": [{"role": "user", "content": "x"}], "cache_salt": ""}, 400),
    ({"model": "canary", "messages": "hello"}, 400),
    ({"model": "canary", "messages": [{"role": "user", "content": 5}]}, 400),
    ({"model": "canary", "messages": [{"role": "wizard", "content": "x"}]}, 400),
    ({"model": "canary", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, 400),
    ({"model": "canary", "messages": []}, 400),
])
def test_bad_input_gets_openai_style_4xx_and_server_keeps_serving(server, body, status):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server + "/v1/chat/completions", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["code"] == status
    assert httpx.get(server + "/health").status_code == 200


def test_completion_prompt_over_max_model_len(server):
    r = httpx.post(server + "/v1/completions", json={"model": "canary", "prompt": [5] * 2100})
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/completions", json={"model": "canary", "prompt": [99999]})
    assert r.status_code == 400


def test_schema_fuzzing_finds_no_server_error(server):
    """schemathesis over the server's own OpenAPI schema: no generated request gets a 5xx."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(server + "/openapi.json")
    failures, calls = [], []
    def fuzz(operation):
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def run(case):
            body = case.body
            if isinstance(body, dict) and isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
                body["max_tokens"] = 8  # keep generation short; validation paths are what matter
            response = case.call(timeout=60)
            calls.append(response.status_code)
            if response.status_code >= 500:
                failures.append((operation.label, body, response.status_code, response.text[:200]))

        run()

    for result in schema.get_all_operations():
        fuzz(result.ok())
    assert len(calls) >= 100
    assert not failures, failures[:3]
    assert httpx.get(server + "/health").status_code == 200


def test_probe_plans_the_same_lengths_by_usage_as_by_tokenize(server):
    """Without /tokenize the probe counts with usage.prompt_tokens: same schedule."""
    import dataclasses

    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from kvdiag.runners.live.endpoint import Endpoint
    from kvdiag.runners.live.tokenizer import RemoteTokenizer

    suite = load_suite("smoke")
    case = dataclasses.replace(suite.cases[0], sessions=2, rounds=4)
    by_tokenize = plan_case(suite, case, RemoteTokenizer(Endpoint(server, "canary")))
    by_usage = plan_case(suite, case, RemoteTokenizer(Endpoint(server, "canary"), use_usage=True))
    assert by_usage.schedule.prompt_lengths == by_tokenize.schedule.prompt_lengths
    assert by_usage.schedule.answer_lengths == by_tokenize.schedule.answer_lengths


def test_reset_prefix_cache_empties_the_cache(server):
    body = {"model": "canary", "max_tokens": 4,
            "messages": [{"role": "user", "content": " ".join(["gafu leyi"] * 30) + " " + FACT}]}
    httpx.post(server + "/v1/chat/completions", json=body)
    warm = httpx.post(server + "/v1/chat/completions", json=body).json()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert httpx.post(server + "/reset_prefix_cache").status_code == 200
    cold = httpx.post(server + "/v1/chat/completions", json=body).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cold["choices"][0]["message"]["content"] == warm["choices"][0]["message"]["content"]
