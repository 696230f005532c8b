"""Who a live server is, as a probe needs to know: its engine and version, the served model's
digest (its /v1/models entry: weights cannot be hashed from outside), SGLang's /server_info,
llama.cpp's /props, vLLM's /version and cache config (its /metrics gauge), the engine's
prefix-cache counters in /metrics, and the protocol it
speaks beyond OpenAI's API (kvdiag.engines.protocol). A mixin of kvdiag.runners.live.endpoint
.Endpoint (it uses the endpoint's `_sync` and `model`)."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property

from kvdiag.engines import routes
from kvdiag.engines.llamacpp.protocol import is_llamacpp
from kvdiag.engines.spec import ENGINES, CacheCounters
from kvdiag.errors import KvdiagError

# a server of no engine kvdiag knows is read with vLLM's names (kvdiag serve shares most)
VLLM_COUNTERS = ENGINES["vllm"].counters
COUNTERS = {
    **{name: spec.counters for name, spec in ENGINES.items()},
    "kvdiag-serve": CacheCounters(VLLM_COUNTERS.queries, VLLM_COUNTERS.hits,
                                  ("kvdiag_evicted_blocks_total",), VLLM_COUNTERS.preemptions,
                                  ("kvdiag_requests_aborted_total",), VLLM_COUNTERS.waiting),
}


def every_server(counter: str) -> tuple[str, ...]:
    """One counter's names (preemptions, aborts, waiting) across every server kvdiag knows:
    the probe sums whichever its server reports, so it never needs the server's name."""
    return tuple(dict.fromkeys(name for c in COUNTERS.values() for name in getattr(c, counter)))


class ServerIdentity:
    def _json(self, path: str) -> dict | None:
        try:
            r = self._sync("GET", path)
            return r.json() if r.status_code == 200 else None
        except (ValueError, KvdiagError):
            return None

    @cached_property
    def _identity(self) -> tuple[str, str]:
        version = self._json(routes.VERSION)
        info = (self._json(routes.OPENAPI) or {}).get("info") or {}
        title = str(info.get("title", "")).lower()
        if "kvdiag" in title:
            return "kvdiag-serve", str(info.get("version", "unknown"))
        if "version" in self.server_info:
            return "sglang", str(self.server_info["version"])
        if is_llamacpp(self.props):
            return "llamacpp", str(self.props.get("build_info", "unknown"))
        if version and "version" in version:
            return "vllm", str(version["version"])
        return (title or "unknown"), str(info.get("version", "unknown"))

    @cached_property
    def server_info(self) -> dict:
        """SGLang's GET /server_info (page_size, max_total_num_tokens, version), or {}."""
        return next(filter(None, map(self._json, routes.SERVER_INFO)), {})

    @cached_property
    def props(self) -> dict:
        """llama.cpp's GET /props (default_generation_settings.n_ctx, total_slots,
        build_info), or {}."""
        return self._json(routes.PROPS) or {}

    def cache_config(self) -> dict[str, str]:
        """The labels of vLLM's `vllm:cache_config_info` gauge (block_size, num_gpu_blocks, ...,
        all strings), or {} when /metrics has none."""
        r = self._sync("GET", routes.METRICS)
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
        found = (self._json(routes.VERSION) or {}).get("version")
        return str(found) if found is not None else None

    @cached_property
    def protocol(self):
        """What the server speaks beyond OpenAI's API (kvdiag.engines.protocol): its engine's;
        vLLM's shape for kvdiag serve and servers of no engine kvdiag knows."""
        from kvdiag.engines.protocol import OPENAI

        spec = ENGINES.get(self._identity[0])
        return spec.protocol() if spec is not None else OPENAI

    @property
    def abort_api(self) -> bool:
        """Whether the server aborts a request by the rid its client gave it (SGLang's POST
        /abort_request; vLLM aborts when the client goes, and has no such endpoint)."""
        spec = ENGINES.get(self._identity[0])
        return spec is not None and spec.abort_api

    def identity(self) -> dict:
        """{"name": vllm | sglang | llamacpp | kvdiag-serve | the OpenAPI title, "version"}."""
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
