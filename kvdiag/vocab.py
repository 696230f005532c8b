"""The words every part of kvdiag shares (docs/architecture.md's vocabulary), each defined once.
Torch-free and import-free, so suites, metrics, runners, reports and the CLI can all use it."""

from reference_engine.log_lines import GUARD_LOG_LINE, PAGED_ATTENTION_LINE

# the ground-truth series of every in-process run: no paging, no prefix cache, no reuse
CONTIGUOUS = "contiguous"
# a case's traffic replayed through vLLM's own KVCacheManager (kvdiag.runners.replay.vllm)
VLLM = "vllm"
# allocators expected to stay flat, besides every guarded one
CLEAN_ALLOCATORS = ("prefix-cache", VLLM)
# how a session's turns are written: the canary's fact lines, or English for real chat models
STYLES = ("canary", "natural")
# BRAI above this is an alert (verify --expect-guard, regress, the report, Prometheus rules)
BRAI_MAX = 0.05

__all__ = ["BRAI_MAX", "CLEAN_ALLOCATORS", "CONTIGUOUS", "GUARD_LOG_LINE",
           "PAGED_ATTENTION_LINE", "STYLES", "VLLM"]
