"""The catalog of KV-cache faults kvdiag plants into a real vLLM (plants/), one entry per
fault, each tied to the real reports it re-creates. Data only: no vLLM import, so the CLI
can list faults and check a name before anything starts.

What each field means: kvdiag.engines.fault. `traffic` says what a run must send for the
fault to act at all; a run without it passes a planted server and says nothing of its class.
A fault with an argument is named NAME:ARG (`slot-omitted:5`, `range-omitted:4-11`): parse()
reads it, in this one place; the bare NAME plants its default.
"""

from __future__ import annotations

from kvdiag.engines.fault import BREAKS_GROUND_TRUTH, BREAKS_ISOLATION, CORRUPTS_OUTPUT, Fault

# why the model-free audit cannot reach a fault that lives at one of these events: its replay
# of the suite's trace drives none of them (tests/kvdiag/runners/replay/test_vllm_lifecycle.py
# shows each such plant acting on a hand-made trace of its event, and the live probe drives it)
NOT_REPLAYED = {
    "chunked-prefill": "the model-free replay of the suite's trace prefills every prompt in one step",
    "preemption": "the model-free replay of the suite's trace never runs out of blocks mid-decode",
    "backlog": "the model-free replay of the suite's trace never fails an admission",
}

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault(
        "stale-hash", "stale hash entry",
        "a recycled block's old hash entries stay in the hash map, so the old prefix still "
        "hits the block that now holds another request's K/V",
        "vllm/v1/core/block_pool.py:BlockPool._maybe_evict_cached_block",
        ('nano-vllm "fix cache hit" commit (BlockManager kept hash_to_block_id entries of '
         "recycled blocks)",
         "kekzl/imp #1301 (mutant M25: stale-hash cleanup never runs, survived the suite)"),
        (CORRUPTS_OUTPUT,),
        "pool pressure that recycles cached blocks, then a prefix whose blocks were "
        "recycled asked again", live="probe"),
    Fault(
        "salt-ignored", "isolation: extra key dropped",
        "cache_salt is left out of the block hash, so requests with different salts share "
        "blocks",
        "vllm/v1/core/kv_cache_utils.py:generate_block_hash_extra_keys",
        ("vLLM PR #17045 / RFC #16016 (cache_salt, CVE-2025-46570): the isolation this "
         "fault removes",),
        (BREAKS_ISOLATION, BREAKS_GROUND_TRUTH),
        "two salts on the same prompt, and a check that a salted (isolated) request "
        "reports 0 cached tokens; equal tokens give equal K/V, so outputs stay right", live="isolation"),
    Fault(
        "double-free", "use-after-free",
        "freeing a request drops every reference to its shared blocks, so a block still in "
        "another running request's table returns to the free queue and is recycled under it",
        "vllm/v1/core/block_pool.py:BlockPool.free_blocks",
        ("vLLM #42571 (free_blocks over the same block twice: the free queue counts one "
         "block twice)",
         "SGLang #38319 (as cited by kvdiag issue 25; not found in the searchable index)"),
        (CORRUPTS_OUTPUT,),
        "requests that share cached blocks and overlap in time, one finishing while the "
        "other still decodes, under pool pressure so the freed block is recycled", live="probe",
        event="early-free"),
    Fault(
        "weak-hash", "hash collision",
        "block hashes are truncated to a few bits (10 by default), so blocks of different "
        "content collide and a lookup hits a block holding other tokens",
        "vllm/v1/core/kv_cache_utils.py:hash_block_tokens",
        ("vLLM GHSA-rm76-4mrf-v9r8 / PR #12621 (predictable builtin-hash chains, "
         "collisions could be forced)",
         "vLLM PR #15297 (sha256 for prefix caching)",
         "openvinotoolkit/openvino.genai #3722 (a collision silently reuses a wrong block)"),
        (CORRUPTS_OUTPUT, BREAKS_ISOLATION),
        "many distinct blocks (hundreds) live in the cache while new prompts look up "
        "their first uncached block", live="probe"),
    Fault(
        "partial-hash", "hash covers part of the block",
        "the block hash leaves out the last token of every block (an off-by-one), so prompts "
        "that differ only there share the block and every block after it",
        "vllm/v1/core/kv_cache_utils.py:hash_block_tokens",
        ("kekzl/imp #1301 (mutant M23: compute_block_hash ignores the block's last token, "
         "survived the suite)",),
        (CORRUPTS_OUTPUT,),
        "sessions that diverge from one another at the last slot of a block (any offset "
        "within a block, not only block starts)", live="probe"),
    Fault(
        "slot-omitted", "hash covers part of the block",
        "the block hash leaves out one slot of every block (offset K: slot-omitted:K, 0 by "
        "default), so prompts that differ only at that offset share the block and every "
        "block after it",
        "vllm/v1/core/kv_cache_utils.py:hash_block_tokens",
        ("vLLM #56655 / PR #56656 (which positions of a mixed prompt-embeds request take "
         "supplied embeddings was left out of the block key: wrong K/V reused)",
         "InternLM/lmdeploy PR #4985 (prompt embeddings keyed by token range only)",
         "kekzl/imp #1301 (mutant M23: one slot of every block outside the hash)"),
        (CORRUPTS_OUTPUT,),
        "prompts that differ from an earlier one at offset K of a block and nowhere else in "
        "it (the differential phase sends one per offset)", live="probe"),
    Fault(
        "range-omitted", "hash covers part of the block",
        "the block hash leaves out slots A..B of every block (range-omitted:A-B, 2-5 by "
        "default), so prompts that differ only there share the block and every block after it",
        "vllm/v1/core/kv_cache_utils.py:hash_block_tokens",
        ("LMCache #690 (image placeholder spans keyed by their dummy token ids: every image "
         "shared one KV entry)",
         "ROCm/ATOM PR #1358 (placeholder tokens share one id: blocks of different images "
         "hash alike)",
         "vLLM PR #11187 (the image hash joins the block key, for the same reason)"),
        (CORRUPTS_OUTPUT,),
        "prompts that differ from an earlier one inside slots A..B of a block only", live="probe"),
    Fault(
        "parent-ignored", "hash covers part of the chain",
        "a block is hashed without its parent's hash (tokens and extra keys only), so the same "
        "block content hits at another position or after another prefix",
        "vllm/v1/core/kv_cache_utils.py:hash_block_tokens",
        ("vllm-project/aibrix #2329 / PR #2330 (cache keys compared the last block hash and "
         "block count only: entries of different prefixes conflated)",
         "vLLM PR #12603 (blocks of equal tokens whose parent blocks had other extra keys "
         "hashed alike)"),
        (CORRUPTS_OUTPUT,),
        "a prompt whose later blocks repeat an earlier request's blocks in another order, at "
        "another offset, or after another first block", live="probe"),
    Fault(
        "lora-ignored", "isolation: extra key dropped",
        "the LoRA adapter is left out of the block hash, so base and adapter requests (or "
        "two adapters) share blocks computed under other weights",
        "vllm/v1/core/kv_cache_utils.py:generate_block_hash_extra_keys",
        ("vLLM #3264 / PR #3263 (automatic prefix caching vs multi-LoRA)",
         "vLLM PR #8240 (block manager v2 hashed tokens only)",
         "vLLM #30931 (same lora_name, different adapter, shared blocks)"),
        (CORRUPTS_OUTPUT, BREAKS_ISOLATION),
        "a server with an adapter, and base and adapter requests on the same prefixes, "
        "each judged against an isolated twin of its own model", live="probe-adapter"),
    Fault(
        "reset-noop", "stale KV after reset",
        "reset_prefix_cache answers success (and logs it) but drops no hash entry, so "
        "every cached block stays hittable",
        "vllm/v1/core/block_pool.py:BlockPool.reset_prefix_cache",
        ("vllm-project/vllm-omni #6739 (reset_prefix_cache a stub: stale KV after weight "
         "updates)",
         "vLLM #9744 (no cache flush after load_weights)",
         "InternLM/lmdeploy #4917 (/update_weights keeps prefix-cache KV)"),
        (BREAKS_GROUND_TRUTH, CORRUPTS_OUTPUT),
        "a reset, then the same prompt again, checked for 0 cached tokens (the probe's "
        "'after reset' pair; vllm-local serves the reset in vLLM's dev mode); output only "
        "changes where weights changed in between", live="probe"),
    Fault(
        "tags-dropped", "isolation: extra keys untagged",
        "extra keys lose their tags (LoRA name and cache_salt become bare strings), so a "
        "cache_salt equal to an adapter name hits that adapter's first block",
        "vllm/v1/core/kv_cache_utils.py:generate_block_hash_extra_keys",
        ("vLLM #44701 / PR #44706 (LoRA name and cache_salt folded into one untagged "
         "extra-key domain)",),
        (BREAKS_ISOLATION, CORRUPTS_OUTPUT),
        "a base request whose cache_salt equals a served adapter's name, on a prompt the "
        "adapter already cached; only the first block collides", live="isolation-adapter"),
    Fault(
        "prompt-logprobs-cached", "prompt logprobs from cached positions",
        "requests asking for prompt logprobs read the prefix cache; positions served from "
        "the cache are never computed and come back as zeros (logprob 0.0, token 0)",
        "vllm/v1/request.py:Request.get_skip_reading_prefix_cache "
        "(+ vllm/v1/outputs.py:LogprobsTensors.empty_cpu zero-filled)",
        ("vLLM #5162 / PR #6456 (prompt logprobs wrong on reused prefixes)",
         "vLLM #42019 / PR #42245 (cached positions hold stale values: torch.empty)"),
        (CORRUPTS_OUTPUT,),
        "requests with prompt_logprobs on prefixes already cached, compared with an "
        "isolated twin's prompt logprobs", live="probe"),
    # --- lifecycle faults: the key is right, the bytes behind it are not ---------------------
    Fault(
        "published-before-written", "published before written",
        "a prompt in chunked prefill gets its whole prompt's blocks at its first chunk and "
        "publishes all of them at once, so a same-prefix request arriving before the later "
        "chunks ran hits blocks holding zeros or a recycled block's bytes",
        "vllm/v1/core/kv_cache_manager.py:KVCacheManager.allocate_slots",
        ("vLLM PR #43569 (eager prefix-cache registration: hashes registered when a step is "
         "scheduled stay hittable when its request is preempted or aborted before the step "
         "ran; the PR rolls them back)",
         "vLLM PR #41400 (prefix-cache block visibility lifecycle: blocks of a cancelled "
         "request registered before their writes ran, left hittable with garbage)",
         "vllm-project/vllm-omni #6039 (vLLM caches block hashes at allocation: a same-step "
         "cross-request hit reads rows written one step later, zeros or stale)"),
        (CORRUPTS_OUTPUT,),
        "a prompt longer than the server's prefill chunk (max_num_batched_tokens), and a "
        "same-prefix request sent while the first is still in prefill", event="chunked-prefill",
        unreachable={"audit": NOT_REPLAYED["chunked-prefill"]}),
    Fault(
        "preempt-stale-progress", "stale progress after preemption",
        "a preempted request keeps its progress (num_computed_tokens) while its blocks are "
        "freed; on resume it skips recomputing its prefix and attends to fresh or recycled "
        "blocks, which it then publishes as computed",
        "vllm/v1/core/sched/scheduler.py:Scheduler._preempt_request",
        ("RBLN-SW/vllm-rbln PR #676 (a preempted request's stashed block ids were re-emitted "
         "on resume: a freed, possibly reused block in its block table)",
         "PaddlePaddle/FastDeploy PR #3080 (a preempted request resumed without re-prefilling "
         "all its tokens, prompt and output)",
         "vllm-project/vllm-gaudi PR #541 (resumed sequences treated as decodes past their "
         "original prefill length)"),
        (CORRUPTS_OUTPUT,),
        "more concurrent long decodes than the pool holds (or than max_num_seqs allows), so "
        "the server preempts running requests and resumes them", event="preemption",
        unreachable={"audit": NOT_REPLAYED["preemption"]}),
    Fault(
        "stale-lookup", "stale lookup reused",
        "a waiting request's prefix lookup is kept when its admission fails and reused on a "
        "later step, after the pool evicted those blocks and handed them to other requests",
        "vllm/v1/core/kv_cache_manager.py:KVCacheManager.get_computed_blocks",
        ("kvdiag issue 31 (the class: a lookup's result reused after its blocks were "
         "reallocated, a retry after admission failed; vLLM's scheduler looks up again on "
         "every step a request waits, vllm/v1/core/sched/scheduler.py)",
         "neuralmagic/vllm PR #92 (a request that could not be scheduled kept the blocks "
         "allocated for it, breaking the resumed-request invariant)"),
        (CORRUPTS_OUTPUT,),
        "an admission backlog (requests waiting for blocks while running decodes fill the "
        "pool) whose waiting requests hit cached prefixes", event="backlog",
        unreachable={"audit": NOT_REPLAYED["backlog"]}),
    Fault(
        "ref-undercount", "use-after-free",
        "a cache hit on a block another request holds takes no reference, so when the holder "
        "finishes the block returns to the free queue while the reader still maps it, and is "
        "recycled under it",
        "vllm/v1/core/block_pool.py:BlockPool.touch",
        ("vLLM #42571 / PR #42612 (a block listed twice in free_blocks: its ref_cnt "
         "decremented once per listing, the free queue over-counts)",
         "Avarok-Cybersecurity/atlas #692 (as quoted in atlas #1193: a matched partial block "
         "pushed into the requester's block table without a reference)",
         "Avarok-Cybersecurity/atlas PR #373 (a cache reference taken against the wrong "
         "block: a block returned to the free list while a live sequence used it)"),
        (CORRUPTS_OUTPUT,),
        "requests that hit a prefix another running request holds, the holder finishing "
        "first, under pool pressure so the freed block is recycled", event="early-free"),
    Fault(
        "cow-dropped", "copy-on-write dropped",
        "a prefix-cache hit that ends inside a block gets a block of its own for the rest of "
        "that block, but the copy of the shared block's prefix into it never reaches the "
        "workers: the request reads zeros or a recycled block's bytes where its prefix was",
        "vllm/v1/core/sched/scheduler.py:Scheduler.schedule (SchedulerOutput.kv_cache_block_copies)",
        ("vLLM PR #46384 (partial prefix-cache hits for hybrid models: copy-on-write of a "
         "shared partial block, worker-side copies fenced by the scheduler)",
         "vLLM PR #51766 (a Mamba copy-on-write misclassified after an external hit: core and "
         "worker disagree about the live block)",
         "vLLM PR #57908 (an aligned prefix-cache snapshot left shared while a resumed "
         "request writes into it)"),
        (CORRUPTS_OUTPUT,),
        "a model with a Mamba group served with --prefix-match-unit below the block size "
        "(kvdiag fixtures build-mamba-hybrid), and prompts that extend an earlier one past a "
        "point inside a block", live="probe-mamba",
        unreachable={"audit": "the model-free replay keeps attention-only KV cache groups, "
                              "where every hit is on the block grid: no copy is ordered"}),
)}


def _offset(arg: str) -> dict:
    slot = int(arg)
    if slot < 0:
        raise ValueError(arg)
    return {"slot": slot}


def _offsets(arg: str) -> dict:
    first, last = (int(a) for a in arg.split("-"))
    if not 0 <= first <= last:
        raise ValueError(arg)
    return {"first": first, "last": last}


# faults that take an argument (NAME:ARG): ARG -> the plant's keyword arguments (ValueError
# when bad), and the form an error shows
ARGUMENTS = {"slot-omitted": (_offset, "slot-omitted:K, K a block offset >= 0"),
             "range-omitted": (_offsets, "range-omitted:A-B, block offsets 0 <= A <= B")}


def parse(spec: str) -> tuple[str, dict]:
    """NAME or NAME:ARG -> (the catalog's name, the plant's keyword arguments); KvdiagError
    (exit 2) naming the fault for an unknown name or a bad argument."""
    from kvdiag.errors import KvdiagError

    name, colon, arg = spec.partition(":")
    if name not in FAULTS:
        raise KvdiagError(f"unknown vLLM fault {spec!r} (known: {', '.join(FAULTS)})")
    if not colon:
        return name, {}
    if name not in ARGUMENTS:
        raise KvdiagError(f"vLLM fault {name!r} takes no argument (given {spec!r})")
    read, form = ARGUMENTS[name]
    try:
        return name, read(arg)
    except ValueError:
        raise KvdiagError(f"vLLM fault {spec!r}: bad argument {arg!r} (expected {form})") from None


def describe(name: str) -> Fault:
    """The catalog entry of NAME or NAME:ARG, or KvdiagError naming the known faults (exit 2)."""
    return FAULTS[parse(name)[0]]
