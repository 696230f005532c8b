"""A live OpenAI-compatible endpoint (vLLM, SGLang, kvdiag serve): chat requests with
retries and backoff, token counts through /tokenize, /metrics scrapes, and who the server
is (engine, version, the served model's digest, its prefix-cache counters)."""

from __future__ import annotations

import json
import time
import uuid
from functools import cached_property

import httpx

from kvdiag.engines import routes
from kvdiag.errors import EndpointError, KvdiagError
from kvdiag.runners.live import retry
from kvdiag.runners.live.identity import ServerIdentity
from kvdiag.runners.live.replies import (  # noqa: F401 (ChatResult: where callers import it)
    REQUEST_ID,
    ChatResult,
    chat_result,
    completion_result,
    prompt_logprobs_of,
    timed,
    usage_fields,
)


class Endpoint(ServerIdentity):
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 timeout: float = 300.0, retries: int = 4,
                 max_wait: float = retry.MAX_WAIT) -> None:
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.model, self.retries, self.max_wait = model, retries, max_wait
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sync = httpx.Client(base_url=self.base, headers=headers, timeout=timeout)
        self._async_kw = {"base_url": self.base, "headers": headers, "timeout": timeout,
                          "limits": httpx.Limits(max_connections=256)}
        self.client = httpx.AsyncClient(**self._async_kw)
        self._count_cache: dict[str, list[int]] = {}
        self.has_tokenize = True
        self.reuse_chunk = 0  # sent where the server takes it per request (protocol.pin_reuse)
        self.slot_files: str | None = None  # its slot folder, where kvdiag started it (slotlife.py)

    async def aclose(self) -> None:
        await self.client.aclose()
        self.sync.close()

    async def new_loop(self) -> None:
        """Close the async client, whose connections belong to the running event loop, and
        start a fresh one for the next loop (work done before the probe's own)."""
        await self.client.aclose()
        self.client = httpx.AsyncClient(**self._async_kw)

    # --- plumbing ------------------------------------------------------------------------
    def _sync(self, method: str, path: str, **kw) -> httpx.Response:
        """One request, retried as kvdiag/runners/live/retry.py says (Retry-After honoured)."""
        return retry.request(self.sync, self.retries, self.base, method, path,
                             self.max_wait, **kw)

    async def _async(self, method: str, path: str, **kw) -> httpx.Response:
        return await retry.arequest(self.client, self.retries, self.base, method, path,
                                    self.max_wait, **kw)

    # --- what the probe uses -------------------------------------------------------------
    def check(self) -> list[str]:
        """The served model ids; raises EndpointError (exit 2) when down or the model is absent."""
        r = self._sync("GET", "/v1/models")
        if r.status_code != 200:
            raise EndpointError(f"{self.base}/v1/models answered HTTP {r.status_code}")
        ids = [m.get("id") for m in r.json().get("data", [])]
        if self.model not in ids:
            raise EndpointError(f"{self.base} does not serve model {self.model!r} (it serves: {', '.join(map(str, ids))})")
        return ids

    @cached_property
    def adapters(self) -> dict[str, dict]:
        """LoRA adapters served beside the models (llama.cpp's /lora-adapters): name -> the
        fields a request names it with; {} where adapters are models (vLLM, SGLang)."""
        return self.protocol.adapters(self._sync)

    def tokenize_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        key = json.dumps([messages, add_generation_prompt])
        if key not in self._count_cache:
            self._count_cache[key] = self._tokens(self.protocol.tokenize(self.model, {
                "messages": messages, "add_generation_prompt": add_generation_prompt}))
        return self._count_cache[key]

    def _tokens(self, steps) -> list[int]:
        """Drive a protocol's tokenize steps (engines/protocol.py) with this endpoint's calls;
        EndpointError on an answer other than 200 (a 404 also marks the server as having no
        tokenizer endpoint)."""
        path, body = next(steps)
        while True:
            r = self._sync("POST", path, json=body)
            if r.status_code == 404:
                self.has_tokenize = False
                raise EndpointError(f"{self.base} has no {path} endpoint")
            if r.status_code != 200:
                raise EndpointError(f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
            try:
                path, body = steps.send(r.json())
            except StopIteration as done:
                return done.value

    def count_by_usage(self, messages: list[dict] | None = None, prompt: str | None = None) -> int:
        """Fallback when the server has no /tokenize: the prompt token count that a one-token
        request reports in usage.prompt_tokens (the prefix cache makes repeats cheap)."""
        key = json.dumps(["usage", messages, prompt])
        if key not in self._count_cache:
            if messages is not None:
                body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0.0}
                r = self._sync("POST", "/v1/chat/completions", json=body)
            else:
                body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
                r = self._sync("POST", "/v1/completions", json=body)
            if r.status_code != 200 or "usage" not in r.json():
                raise EndpointError(f"cannot count tokens: no /tokenize and usage answered HTTP {r.status_code}")
            self._count_cache[key] = [0] * int(r.json()["usage"]["prompt_tokens"])
        return len(self._count_cache[key])

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokens(self.protocol.tokenize(self.model, {"prompt": text}, add_special_tokens))

    async def _generate(self, path: str, what: str, cache_salt: str | None, body: dict,
                        auth: str | None = None, isolated: bool = False) -> dict:
        """POST a generation request under an X-Request-Id of its own, which engines put in
        their request id (a sentinel's findings name it); `isolated`: kept off the prefix cache
        as the server's protocol does it, else in namespace `cache_salt` when given. Its
        JSON, with that id under REQUEST_ID, or EndpointError."""
        if body.get("model") not in (None, self.model) and body["model"] in self.adapters:
            body |= self.adapters[body["model"]]  # an adapter the server names by a field of its own
            body["model"] = self.model
        if isolated:
            self.protocol.isolate(body)
        elif cache_salt is not None:
            self.protocol.namespace(body, cache_salt)
        self.protocol.pin_reuse(body, self.reuse_chunk)
        rid = f"kvdiag-{uuid.uuid4().hex[:16]}"
        if self.abort_api:  # a server that takes its client's rid (SGLang) names it so
            body.setdefault("rid", rid)
        headers = {"X-Request-Id": rid} | ({"Authorization": auth} if auth else {})
        r = await self._async("POST", path, json=body, headers=headers)
        if r.status_code != 200:
            raise EndpointError(f"{what} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json() | {REQUEST_ID: rid}

    async def chat(self, messages: list[dict], max_tokens: int, *, cache_salt: str | None = None,
                   top_logprobs: int = 5, model: str | None = None,
                   isolated: bool = False) -> ChatResult:
        """One greedy chat completion; `model`: an adapter the server serves, instead of the
        endpoint's model; `isolated`: kept off the prefix cache (a twin's ground truth)."""
        return await self.generate("/v1/chat/completions", {
            "model": model or self.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "logprobs": True, "top_logprobs": top_logprobs}, cache_salt,
            isolated=isolated)

    async def complete(self, token_ids: list[int], max_tokens: int, *, cache_salt: str | None = None,
                       top_logprobs: int = 5, model: str | None = None,
                       ignore_eos: bool = False, isolated: bool = False,
                       id_slot: int | None = None) -> ChatResult:
        """One greedy completion of a prompt given as token ids (/v1/completions, legacy
        logprobs): the differential and lifecycle phases' requests, free of any chat
        template. `ignore_eos`: decode all `max_tokens`, as the server's protocol asks for it
        (`decode_all`); `id_slot`: the slot it must run on, where the server has slots."""
        body = self._completion_body(token_ids, max_tokens, top_logprobs, model, id_slot)
        if ignore_eos:
            self.protocol.decode_all(body)
        return await self.generate("/v1/completions", body, cache_salt, isolated=isolated)

    async def complete_n(self, token_ids: list[int], max_tokens: int, n: int, *,
                         id_slot: int | None = None, top_logprobs: int = 5) -> list[ChatResult]:
        """One greedy completion request for `n` completions of one prompt (OpenAI's `n`;
        llama-server's n_cmpl runs each beyond the first in a slot of its own, copied from the
        first's cells): every choice, by its index, each with the request's usage."""
        body = self._completion_body(token_ids, max_tokens, top_logprobs, None, id_slot) | {"n": n}
        sent = time.time()
        data = await self._generate("/v1/completions", "completion", None, body)
        order = sorted(range(len(data["choices"])), key=lambda i: data["choices"][i].get("index", i))
        return [timed(completion_result(data, i), sent) for i in order]

    def _completion_body(self, token_ids: list[int], max_tokens: int, top_logprobs: int,
                         model: str | None, id_slot: int | None) -> dict:
        """A greedy /v1/completions body for a prompt of token ids, pinned to `id_slot` where given."""
        body = {"model": model or self.model, "prompt": list(token_ids), "max_tokens": max_tokens,
                "temperature": 0.0, "logprobs": top_logprobs}
        if id_slot is not None:
            self.protocol.pin_slot(body, id_slot)
        return body

    def slot_action(self, slot: int, action: str, filename: str | None = None) -> dict:
        """Save, restore or erase one of the server's slots (llama.cpp's POST
        /slots/ID?action=...): its answer's fields, with ok, or ok False and the error."""
        return self.protocol.slot_action(self._sync, slot, action, filename)

    async def generate(self, path: str, body: dict, cache_salt: str | None = None,
                       auth: str | None = None, isolated: bool = False) -> ChatResult:
        """Any body for /v1/chat/completions or /v1/completions (non-streaming), its answer
        read the same way (kvdiag watch re-sends a client's own prompt fields so, under the
        client's own Authorization, `auth`)."""
        sent = time.time()
        chat = path.endswith("chat/completions")
        data = await self._generate(path, "chat completion" if chat else "completion",
                                    cache_salt, dict(body), auth, isolated)
        return timed((chat_result if chat else completion_result)(data), sent)

    async def prompt_logprobs(self, token_ids: list[int], *, cache_salt: str | None = None,
                              model: str | None = None, isolated: bool = False) -> ChatResult:
        """The logprob of every prompt token (vLLM's prompt_logprobs=0: the token's own
        only), for a prompt given as token ids, in extra["prompt_logprobs"] as [token id,
        logprob] per position (None for the first)."""
        sent = time.time()
        data = await self._generate("/v1/completions", "completion", cache_salt, {
            "model": model or self.model, "prompt": list(token_ids), "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": 0}, isolated=isolated)
        return timed(ChatResult(text="", tokens=[], top=[], logprobs=[], finish_reason=None,
                                 extra={"prompt_logprobs": prompt_logprobs_of(data)}, **usage_fields(data)),
                      sent)

    def prompt_logprobs_supported(self, token_ids: list[int]) -> bool:
        """Does the server give prompt logprobs (vLLM's prompt_logprobs) for these ids?"""
        body = {"model": self.model, "prompt": list(token_ids), "max_tokens": 1, "prompt_logprobs": 0}
        try:
            r = self._sync("POST", "/v1/completions", json=body)
            return r.status_code == 200 and bool(prompt_logprobs_of(r.json()))
        except (ValueError, KvdiagError):
            return False

    def salt_supported(self) -> tuple[bool, str]:
        """Does the server keep one request off its cache, as its protocol does it (vLLM's
        cache_salt, llama.cpp's cache_prompt: false)? (a one-token request)"""
        return self.protocol.isolation_works(self._sync, self.model)

    def reset_prefix_cache(self) -> bool:
        """Empty the server's prefix cache as its protocol does it (vLLM's POST
        /reset_prefix_cache, served with VLLM_SERVER_DEV_MODE=1; SGLang's /flush_cache);
        False when that does not work (or requests are in flight, or the engine has none)."""
        return self.protocol.reset(self._sync)

    def metrics(self) -> dict[str, float]:
        """Counters from /metrics, summed over label sets (empty when the endpoint has none); a
        counter declared without a sample yet reads 0."""
        r = self._sync("GET", routes.METRICS)
        if r.status_code != 200:
            return {}
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, float] = {}
        for family in text_string_to_metric_families(r.text):
            if family.type == "counter" and not family.samples:
                # a labelled counter is declared before its first increment (SGLang's
                # retractions): it is there, at zero
                out.setdefault(f"{family.name}_total", 0.0)
            for sample in family.samples:
                if sample.labels.get("model_name") not in (None, self.model):
                    continue
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
        return self.protocol.counters(out)
