"""A live OpenAI-compatible endpoint (vLLM, SGLang, kvdiag serve): chat requests with
retries and backoff, token counts through /tokenize, /metrics scrapes, and who the server
is (engine, version, the served model's digest, its prefix-cache counters)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from functools import cached_property

import httpx

from kvdiag.errors import EndpointError, KvdiagError
from kvdiag.runners.live import retry


@dataclass
class ChatResult:
    text: str
    tokens: list[str]  # generated tokens, from logprobs (empty when the server gives none)
    top: list[list[tuple[str, float]]]  # per token: the top alternatives, best first
    logprobs: list[float]
    prompt_tokens: int
    cached_tokens: int | None
    finish_reason: str | None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CacheCounters:
    """An engine's prefix-cache counters in /metrics: prompt tokens looked up, of those served
    from the cache, and cached blocks evicted (summed where several exist)."""

    queries: str
    hits: str
    evictions: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, str]:
        return self.queries, self.hits


VLLM_COUNTERS = CacheCounters("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                              ("vllm:prefix_cache_evictions_total", "vllm:kv_cache_evictions_total"))
COUNTERS = {
    "vllm": VLLM_COUNTERS,
    "kvdiag-serve": CacheCounters(VLLM_COUNTERS.queries, VLLM_COUNTERS.hits,
                                  ("kvdiag_evicted_blocks_total",)),
    # SGLang counts evicted tokens, not blocks: any rise is recycling all the same
    "sglang": CacheCounters("sglang:prompt_tokens_total", "sglang:cached_tokens_total",
                            ("sglang:evicted_tokens_total",)),
}


class Endpoint:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 timeout: float = 300.0, retries: int = 4,
                 max_wait: float = retry.MAX_WAIT) -> None:
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.model, self.retries, self.max_wait = model, retries, max_wait
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sync = httpx.Client(base_url=self.base, headers=headers, timeout=timeout)
        self.client = httpx.AsyncClient(base_url=self.base, headers=headers, timeout=timeout,
                                        limits=httpx.Limits(max_connections=256))
        self._count_cache: dict[str, list[int]] = {}
        self.has_tokenize = True

    async def aclose(self) -> None:
        await self.client.aclose()
        self.sync.close()

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

    def tokenize_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        key = json.dumps([messages, add_generation_prompt])
        if key not in self._count_cache:
            r = self._sync("POST", "/tokenize", json={"model": self.model, "messages": messages,
                                                      "add_generation_prompt": add_generation_prompt})
            if r.status_code == 404:
                self.has_tokenize = False
                raise EndpointError(f"{self.base} has no /tokenize endpoint")
            if r.status_code != 200:
                raise EndpointError(f"/tokenize answered HTTP {r.status_code}: {r.text[:200]}")
            self._count_cache[key] = r.json()["tokens"]
        return self._count_cache[key]

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
        r = self._sync("POST", "/tokenize", json={"model": self.model, "prompt": text,
                                                  "add_special_tokens": add_special_tokens})
        if r.status_code != 200:
            raise EndpointError(f"/tokenize answered HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["tokens"]

    async def chat(self, messages: list[dict], max_tokens: int, *, cache_salt: str | None = None,
                   top_logprobs: int = 5, model: str | None = None) -> ChatResult:
        """One greedy chat completion; `model`: an adapter the server serves, instead of the
        endpoint's model."""
        body = {"model": model or self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0.0, "logprobs": True, "top_logprobs": top_logprobs}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        t0 = time.perf_counter()
        r = await self._async("POST", "/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise EndpointError(f"chat completion answered HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        choice = data["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return ChatResult(
            text=choice["message"].get("content") or "",
            tokens=[c["token"] for c in content],
            top=[[(t["token"], t["logprob"]) for t in c.get("top_logprobs") or []] for c in content],
            logprobs=[c["logprob"] for c in content],
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=details.get("cached_tokens"),
            finish_reason=choice.get("finish_reason"),
            seconds=time.perf_counter() - t0)

    async def prompt_logprobs(self, token_ids: list[int], *, cache_salt: str | None = None,
                              model: str | None = None) -> ChatResult:
        """The logprob of every prompt token (vLLM's prompt_logprobs=0: the token's own
        only), for a prompt given as token ids, in extra["prompt_logprobs"] as [token id,
        logprob] per position (None for the first)."""
        body = {"model": model or self.model, "prompt": list(token_ids), "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": 0}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        t0 = time.perf_counter()
        r = await self._async("POST", "/v1/completions", json=body)
        if r.status_code != 200:
            raise EndpointError(f"completion answered HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        usage = data.get("usage") or {}
        return ChatResult(text="", tokens=[], top=[], logprobs=[],
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                          finish_reason=None, seconds=time.perf_counter() - t0,
                          extra={"prompt_logprobs": _prompt_logprobs(data)})

    def prompt_logprobs_supported(self, token_ids: list[int]) -> bool:
        """Does the server give prompt logprobs (vLLM's prompt_logprobs) for these ids?"""
        body = {"model": self.model, "prompt": list(token_ids), "max_tokens": 1, "prompt_logprobs": 0}
        try:
            r = self._sync("POST", "/v1/completions", json=body)
            return r.status_code == 200 and bool(_prompt_logprobs(r.json()))
        except (ValueError, KvdiagError):
            return False

    def salt_supported(self) -> tuple[bool, str]:
        """Does the server take vLLM's cache_salt? (a one-token request with and without)"""
        body = {"model": self.model, "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 1, "cache_salt": "kvdiag-salt-check"}
        r = self._sync("POST", "/v1/chat/completions", json=body)
        if r.status_code == 200:
            return True, ""
        return False, f"HTTP {r.status_code}: {r.text[:160]}"

    def reset_prefix_cache(self) -> bool:
        r = self._sync("POST", "/reset_prefix_cache")
        return r.status_code == 200

    def cache_config(self) -> dict[str, str]:
        """The labels of vLLM's `vllm:cache_config_info` gauge (block_size, num_gpu_blocks, ...,
        all strings), or {} when /metrics has none."""
        r = self._sync("GET", "/metrics")
        if r.status_code != 200:
            return {}
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                if sample.name in ("vllm:cache_config_info", "vllm:cache_config_info_total"):
                    return dict(sample.labels)
        return {}

    def version(self) -> str | None:
        """The server's version from vLLM's GET /version (None when it has none)."""
        r = self._sync("GET", "/version")
        try:
            return str(r.json()["version"]) if r.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            return None

    def metrics(self) -> dict[str, float]:
        """Counters from /metrics, summed over label sets (empty when the endpoint has none)."""
        r = self._sync("GET", "/metrics")
        if r.status_code != 200:
            return {}
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, float] = {}
        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                if sample.labels.get("model_name") not in (None, self.model):
                    continue
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
        return out

    # --- who the server is -----------------------------------------------------------------
    def _json(self, path: str) -> dict | None:
        try:
            r = self._sync("GET", path)
            return r.json() if r.status_code == 200 else None
        except (ValueError, KvdiagError):
            return None

    @cached_property
    def _identity(self) -> tuple[str, str]:
        version = self._json("/version")
        info = (self._json("/openapi.json") or {}).get("info") or {}
        title = str(info.get("title", "")).lower()
        if "kvdiag" in title:
            return "kvdiag-serve", str(info.get("version", "unknown"))
        if "version" in self.server_info:
            return "sglang", str(self.server_info["version"])
        if version and "version" in version:
            return "vllm", str(version["version"])
        return (title or "unknown"), str(info.get("version", "unknown"))

    @cached_property
    def server_info(self) -> dict:
        """SGLang's GET /server_info (page_size, max_total_num_tokens, version), or {}."""
        return self._json("/server_info") or self._json("/get_server_info") or {}

    def identity(self) -> dict:
        """{"name": vllm | sglang | kvdiag-serve | the OpenAPI title, "version"}."""
        name, version = self._identity
        return {"name": name, "version": version}

    @property
    def counters(self) -> CacheCounters:
        return COUNTERS.get(self._identity[0], VLLM_COUNTERS)

    def model_entry(self) -> dict:
        """The served model's /v1/models entry (id, root, max_model_len), or {"id": model}."""
        for entry in (self._json("/v1/models") or {}).get("data", []):
            if entry.get("id") == self.model:
                return {k: entry.get(k) for k in ("id", "root", "max_model_len")}
        return {"id": self.model}

    def model_label(self) -> str:
        """`<served name>@<sha8 of its /v1/models entry>`: the digest of a model kvdiag cannot
        hash from outside (signatures and baseline keys)."""
        entry = json.dumps(self.model_entry(), sort_keys=True).encode()
        return f"{self.model}@{hashlib.sha256(entry).hexdigest()[:8]}"


def _prompt_logprobs(data: dict) -> list:
    """vLLM's prompt_logprobs (per position None or {token id: {"logprob", ...}}; top level
    or in the choice) as [token id, logprob] per position (None for the first)."""
    found = data.get("prompt_logprobs") or ((data.get("choices") or [{}])[0].get("prompt_logprobs"))
    out = []
    for position in found or []:
        if not position:
            out.append(None)
            continue
        token, entry = next(iter(position.items()))
        out.append([int(token), float(entry["logprob"] if isinstance(entry, dict) else entry)])
    return out

