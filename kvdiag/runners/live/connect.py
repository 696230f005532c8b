"""Meeting the server a probe talks to: who it is and its KV cache (`connect`), how its
isolated runs are made (`isolation`: a fresh cache_salt each, or an emptied cache), and its
counters when the probe began (`counters_since`, across a resumed run)."""

from __future__ import annotations

from collections.abc import Callable

from kvdiag.errors import EndpointError, KvdiagError
from kvdiag.planning.suites import Suite
from kvdiag.runners.live import phases as P
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.pressure import ServerCache, read_server_cache


def connect(base_url: str, model: str, api_key: str | None, suite: Suite,
            settings: P.ProbeSettings) -> tuple[Endpoint, dict, ServerCache]:
    """The endpoint (model and adapter served), who the server is, and its KV cache."""
    endpoint = Endpoint(base_url, model, api_key)
    endpoint.reuse_chunk, endpoint.slot_files = settings.reuse_chunk, settings.slot_files
    served = endpoint.check()
    if settings.adapter is not None:
        served += list(endpoint.adapters)  # a model (vLLM, SGLang), or named by a field (llama.cpp)
        if settings.adapter not in served:
            raise EndpointError(f"{base_url} does not serve the adapter {settings.adapter!r} (it "
                                f"serves: {', '.join(map(str, served))})")
    who = {"engine": endpoint.identity(), "model_label": endpoint.model_label(),
           "counters": endpoint.counters}  # asked now: the phases close the endpoint
    server = read_server_cache(endpoint, suite.block_size, block_size=settings.block_size,
                               num_blocks=settings.num_blocks)
    return endpoint, who, server


def isolation(endpoint: Endpoint, base_url: str, warn: Callable[[str], None],
              mode: str = "auto") -> bool:
    """True when isolated runs use a fresh cache_salt each; False for the documented fallback
    (an emptied cache before each isolated request, one at a time). `mode`: auto (salts where
    the server takes them), salt (required), reset (the fallback, even where salts work).
    EndpointError when the chosen way cannot be had."""
    if mode not in ("auto", "salt", "reset"):
        raise KvdiagError(f"--isolation must be auto, salt or reset, got {mode!r}")
    if mode == "reset":
        if not endpoint.reset_prefix_cache():
            raise EndpointError(f"{base_url} has no working /reset_prefix_cache: --isolation reset "
                                "cannot be had")
        return False
    salted, why = endpoint.salt_supported()
    if not salted and mode == "salt":
        raise EndpointError(f"{base_url} rejects cache_salt ({why}): --isolation salt cannot be had")
    if not salted:
        if not endpoint.reset_prefix_cache():
            raise EndpointError(f"{base_url} rejects cache_salt ({why}) and has no /reset_prefix_cache: "
                                "no isolated ground truth can be made")
        warn(f"the server rejects cache_salt ({why}); isolated runs reset the prefix cache "
             "before each request and run one at a time")
    return salted


def counters_since(meta: dict | None, now: dict, queries: str) -> dict:
    """The server's counters when this probe began: those saved in probe.json when resuming
    against the same server process, so that the prefix-cache hit rate covers the whole run.
    A restarted server's counters start again from zero (lower than saved): then only the
    counters from now on are comparable."""
    saved = (meta or {}).get("metrics_before")
    if saved and now.get(queries, 0) >= saved.get(queries, 0):
        return saved
    return now
