"""One entry per real engine kvdiag starts and plants faults into, looked up by name once
(a target string, `kvdiag detect --engine`, the probe's identity of a server) so that no
other module dispatches on an engine's name, and adding an engine means adding an entry.

Data only, no engine import: kvdiag imports without vLLM or SGLang (each lives in its own
venv), so an entry names its catalog, fault check and launcher by "module:attribute", loaded
the first time they are asked for.

    spec = engine_spec("sglang")           # KvdiagError naming the known engines
    spec.check_fault("stale-node"), spec.catalog(), spec.launcher(), spec.log_name
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError

if TYPE_CHECKING:
    from kvdiag.engines.fault import Fault
    from kvdiag.engines.server import EngineServer


@dataclass(frozen=True)
class CacheCounters:
    """An engine's counters in /metrics that the probe reads as evidence: prompt tokens looked
    up and of those served from the cache, then (summed where several exist) cached blocks
    evicted, requests preempted, requests aborted, and the requests waiting (a gauge)."""

    queries: str
    hits: str
    evictions: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    aborts: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, str]:
        return self.queries, self.hits


def _load(path: str):
    """The object at "module:attribute", imported now (so only when first asked for)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class EngineSpec:
    name: str  # --engine NAME, the target NAME-local[:FAULT], what the probe identifies
    label: str  # how messages and logs name it (vLLM, SGLang)
    faults: str  # "module:FAULTS": its catalog, name -> Fault (data only)
    checker: str  # "module:check_fault": NAME[:ARG] or None -> the name, or KvdiagError
    launcher_class: str  # "module:Class": the EngineServer that starts and stops it
    log_name: str  # its server's log, in the run directory
    counters: CacheCounters  # what the probe reads in /metrics as evidence of recycling
    abort_api: bool = False  # it aborts a request by the rid its client gave (POST /abort_request)
    no_audit: str | None = None  # why `kvdiag detect` has no model-free audit of it; None: it has
    sentinel: bool = False  # its kvdiag plugin runs a sentinel (KVDIAG_SENTINEL, kvdiag.sentinel)
    # the stock target runs it by default too (llama.cpp's is a source patch: only the builds
    # kvdiag patches carry it, and the stock build as shipped runs without one unless asked)
    sentinel_stock: bool = True
    protocol_object: str = "kvdiag.engines.protocol:OPENAI"  # what it speaks beyond OpenAI's API
    adapter: str = "canary-lora"  # the LoRA adapter its local target serves (kvdiag.engines.local)

    @property
    def target_kind(self) -> str:
        """Its target string's kind: `vllm-local`."""
        return f"{self.name}-local"

    def catalog(self) -> dict[str, Fault]:
        return _load(self.faults)

    def check_fault(self, name: str | None) -> str | None:
        """The fault as given, or None for none; KvdiagError (exit 2) names the known ones."""
        return _load(self.checker)(name)

    def launcher(self) -> type[EngineServer]:
        return _load(self.launcher_class)

    def protocol(self):
        """Its kvdiag.engines.protocol.OpenAIProtocol (or the engine's own subclass)."""
        return _load(self.protocol_object)


ENGINES = MappingProxyType({s.name: s for s in (
    EngineSpec("vllm", "vLLM", "kvdiag.engines.vllm.catalog:FAULTS",
               "kvdiag.engines.vllm.faults:check_fault",
               "kvdiag.engines.vllm.launcher:VllmLocal", "vllm.log",
               CacheCounters("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                             ("vllm:prefix_cache_evictions_total", "vllm:kv_cache_evictions_total"),
                             preemptions=("vllm:num_preemptions_total",),
                             waiting=("vllm:num_requests_waiting",)), sentinel=True),
    EngineSpec("sglang", "SGLang", "kvdiag.engines.sglang.faults:FAULTS",
               "kvdiag.engines.sglang.faults:check_fault",
               "kvdiag.engines.sglang.launcher:SglangLocal", "sglang.log",
               # SGLang counts evicted tokens, not blocks: any rise is recycling all the same;
               # it retracts a request where vLLM preempts one
               CacheCounters("sglang:prompt_tokens_total", "sglang:cached_tokens_total",
                             ("sglang:evicted_tokens_total",),
                             preemptions=("sglang:num_retracted_requests_total",),
                             aborts=("sglang:num_aborted_requests_total",),
                             waiting=("sglang:num_queue_reqs",)),
               abort_api=True, sentinel=True, protocol_object="kvdiag.engines.sglang.protocol:SGLANG",
               no_audit="kvdiag replays vLLM's allocator only; SGLang's radix tree is probed live"),
    EngineSpec("llamacpp", "llama.cpp", "kvdiag.engines.llamacpp.faults:FAULTS",
               "kvdiag.engines.llamacpp.faults:check_fault",
               "kvdiag.engines.llamacpp.launcher:LlamacppLocal", "llama-server.log",
               # llama.cpp counts prompt tokens without the cached ones: the protocol adds
               # the two into the tokens looked up; it counts no eviction or preemption
               CacheCounters("llamacpp:prompt_tokens_queried_total",
                             "llamacpp:prompt_tokens_cached_total",
                             waiting=("llamacpp:requests_deferred",)),
               sentinel=True, sentinel_stock=False,
               protocol_object="kvdiag.engines.llamacpp.protocol:LLAMACPP", adapter="kvdiag-lora",
               no_audit="kvdiag replays vLLM's allocator only; llama.cpp's slots are probed live"),
)})


def engine_spec(name: str, option: str = "engine") -> EngineSpec:
    """The entry of engine `name`; KvdiagError (exit 2) names `option` and the known ones."""
    if name not in ENGINES:
        *head, last = ENGINES
        raise KvdiagError(f"{option} {name!r}: expected {', '.join(head)} or {last}")
    return ENGINES[name]
