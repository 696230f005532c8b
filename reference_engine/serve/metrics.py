"""The server's /metrics: vLLM's metric names (so dashboards built for vLLM work, and the
probe reads the real block size and pool from vllm:cache_config_info) plus kvdiag's own."""

from __future__ import annotations

from reference_engine.serve.async_engine import AsyncEngine


class Metrics:
    """vLLM's metric names (so dashboards built for vLLM work) plus kvdiag's own."""

    def __init__(self, core: AsyncEngine, model_name: str) -> None:
        self.core, self.labels = core, {"model_name": model_name}

    def render(self) -> str:
        from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

        eng = self.core.engine
        with self.core.lock:
            values = {
                "vllm:prefix_cache_queries": (Counter, "Prefix cache queries, in tokens.", eng.scheduler.prefix_cache_queries),
                "vllm:prefix_cache_hits": (Counter, "Prefix cache hits, in tokens.", eng.scheduler.prefix_cache_hits),
                "vllm:num_preemptions": (Counter, "Cumulative number of preemptions.", eng.scheduler.num_preemptions),
                "kvdiag_evicted_blocks": (Counter, "Cached blocks recycled for new K/V (their cached content discarded).", eng.allocator.num_evicted),
                "kvdiag_guard_rejections": (Counter, "Stale cache entries the SequenceGuard dropped.", eng.allocator.guard_rejections),
                "kvdiag_foreign_slots": (Counter, "KV slots read whose writer's prefix differs from the reader's.", self.core.foreign_slots_total),
                "kvdiag_requests_aborted": (Counter, "Requests dropped before they finished (client gone).", self.core.num_aborted),
                "vllm:kv_cache_usage_perc": (Gauge, "KV-cache usage. 1 means 100 percent usage.", eng.allocator.usage()),
                "vllm:num_requests_running": (Gauge, "Requests in the running batch.", len(eng.scheduler.running)),
                "vllm:num_requests_waiting": (Gauge, "Requests waiting to be scheduled.", len(eng.scheduler.waiting)),
            }
        registry = CollectorRegistry()
        # vLLM's info gauge: the probe plans its jump and pressure from the real block size and pool
        info = {"block_size": str(eng.allocator.block_size), "num_gpu_blocks": str(eng.allocator.num_blocks),
                "enable_prefix_caching": str(eng.config.enable_prefix_caching),
                # not a vLLM label: one request's prefill chunk, for the probe's chunked-prefill
                # traffic (the step's budget, or the per-request cap where there is one)
                "max_num_batched_tokens": str(eng.scheduler.per_request)}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", list(info),
              registry=registry).labels(**info).set(1)
        for name, (kind, doc, value) in values.items():
            metric = kind(name, doc, list(self.labels), registry=registry)
            child = metric.labels(**self.labels)
            if kind is Counter:
                child.inc(value)
            else:
                child.set(value)
        return generate_latest(registry).decode()
