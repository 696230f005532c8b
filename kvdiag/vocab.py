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
# the events of a block's life the live probe drives on purpose and reports reached or not
# (runners/live/lifecycle.py, slotlife.py; docs/probe.md): each lifecycle fault lives at one
# of them; a run's table has the rows its engine's traffic drives (--require all: those)
EVENTS = {
    "recycle": "a freed block that still holds a cached prefix is handed to a new request",
    "early-free": "a request sharing blocks finishes while another still decodes on them",
    "preemption": "the server preempts (vLLM) or retracts (SGLang) a running request and resumes it",
    "cancel-prefill": "a client disconnects before its first token, then the same prefix is asked again",
    "cancel-decode": "a client disconnects mid-decode, then the same prefix is asked again",
    "chunked-prefill": "a prompt longer than the prefill chunk, and a same-prefix request arriving "
                       "while it is still in prefill",
    "backlog": "requests wait for admission while returning sessions ask for their cached prefixes",
    "concurrent-prefill": "requests with one uncached prefix prefilled at the same time "
                          "(SGLang frees the duplicate pages)",
    # an engine of fixed slots over one cache keyed by tokens (llama.cpp): a slot's life
    "ram-cache": "a conversation returns after every slot went to another, and its prompt comes "
                 "back from the RAM prompt cache",
    "slot-restore": "a slot saved to a file, given to another conversation, restored, then asked "
                    "for what it held before the restore and for what was restored",
    "slot-erase": "a slot erased between a conversation's rounds, then the conversation continued",
    "n-children": "a request for n > 1 completions, whose children continue from its cells copied "
                  "into other slots, which held shorter prompts before",
    "chunk-reuse": "a conversation asked with a span pasted in, then as it was: its tail comes back "
                   "as a chunk shifted over the span (llama.cpp's --cache-reuse)",
    "failed-restore": "a slot's restore that fails partway (a file of another conversation, broken "
                      "after its keys), then the conversation the slot held asked again",
}
_SLOTS_ONLY = ("ram-cache", "slot-restore", "slot-erase", "n-children")
CHUNK_REUSE = "chunk-reuse"  # a slot row of its own, only where the server reuses chunks
# a slot row of its own, only where kvdiag can write into the server's slot folder (it started it)
FAILED_RESTORE = "failed-restore"
CANCELS = ("cancel-prefill", "cancel-decode")  # driven on both kinds of engine
SLOT_EVENTS = _SLOTS_ONLY + CANCELS  # an engine of slots' rows, recycle beside them
# a paged engine's rows
BLOCK_EVENTS = tuple(e for e in EVENTS if e not in (*_SLOTS_ONLY, CHUNK_REUSE, FAILED_RESTORE))
# BRAI above this is an alert (verify --expect-guard, regress, the report, Prometheus rules)
BRAI_MAX = 0.05

__all__ = ["BLOCK_EVENTS", "BRAI_MAX", "CANCELS", "CHUNK_REUSE", "CLEAN_ALLOCATORS", "CONTIGUOUS", "EVENTS",
           "FAILED_RESTORE", "GUARD_LOG_LINE", "PAGED_ATTENTION_LINE", "SLOT_EVENTS", "STYLES", "VLLM"]
