"""Replay a trace through vLLM's own block manager (vllm/v1/core: KVCacheManager and its
BlockPool) on CPU, without a model, and audit what it hands out.

The driver makes the calls vLLM's Scheduler.schedule makes, in its order:

    running requests, in order:  allocate_slots(req, chunk)
        no room -> preempt the last running request (vLLM's own _preempt_request: free,
        back to the waiting queue's front, recompute), retry; a request that preempted
        itself ends the pass
    then, if nothing was preempted, waiting requests (FCFS, up to max_num_seqs):
        get_computed_blocks(req) (only at 0 computed tokens, as vLLM) ->
        allocate_slots(req, chunk, hits, hit_blocks)
        (0.33: full_sequence_must_fit, its scheduler's default)
        no room -> stop admitting this step
    after the step: teacher-forced token appended (vLLM extends req.block_hashes);
        a finished request -> free(req)

vLLM's allocator never touches K/V bytes, so a shadow content map (shadow.py) records which
prefix each slot's writer stored, and every request's block table is checked each step
against what it must contain: foreign and unwritten slot reads per request. Invariants of
the BlockPool are checked each step (invariants.py); vLLM's own assertions, if one
fires, are recorded as violations too. vLLM's reuse comes from its own PrefixCacheStats.
"""

from __future__ import annotations

import time
from collections import deque

from kvdiag.errors import KvdiagError
from kvdiag.runners.replay.drive import ReplayResult, drive, records, trace_index
from kvdiag.runners.replay.invariants import Invariants, assertion_site
from kvdiag.runners.replay.shadow import ShadowCache, StepItem
from kvdiag.runners.replay.trace import Trace
from kvdiag.runners.replay.turn import VllmTurn
from kvdiag.runners.replay.vllm_api import CacheStats, VllmApi, load
from reference_engine.util import cdiv

ALLOCATOR = "vllm"


class VllmReplay:
    def __init__(self, trace: Trace, api: VllmApi, *, check: bool = True,
                 cache_after_compute: bool = False, long_prefill_token_threshold: int = 0) -> None:
        """cache_after_compute: register full blocks after the step computes them (as
        reference_engine does) instead of when allocate_slots schedules them (as vLLM
        does); only to explain hit-count differences between the two.
        long_prefill_token_threshold: vLLM's cap on one request's prefill chunk while other
        requests are eligible (0: none, vLLM's default)."""
        cfg = trace.config
        self.api, self.cfg, self.check = api, cfg, check
        self.long_prefill = long_prefill_token_threshold
        self.cache_after_compute = cache_after_compute
        longest = max(len(r.prompt_ids) + len(r.output_ids) for r in trace.requests)
        self.manager = api.make_manager(cfg.num_blocks, cfg.block_size, longest,
                                        cfg.enable_prefix_caching)
        self.index = trace_index(trace)
        self.shadow = ShadowCache(cfg.num_blocks + 1, cfg.block_size) if check else None
        self.invariants = Invariants(self.manager.block_pool, self.shadow) if check else None
        self.waiting: deque[VllmTurn] = deque()
        self.running: list[VllmTurn] = []
        self.cache_stats = CacheStats()  # the run's total, as vLLM's /metrics would count it
        self.num_steps = 0
        self.num_preemptions = 0
        self.manager_seconds = 0.0  # time inside vLLM (manager calls, Request hashing)
        self.epoch = 0  # prefix-cache resets so far: K/V written before one are another model's
        self.cross_tenant_hits = 0  # cache hits on blocks another cache_salt wrote
        self.prompt_logprob_hits = 0  # prompt-logprob requests served tokens from the cache
        self.num_admitted = 0

    # --- requests ----------------------------------------------------------------------
    def add_request(self, prompt_ids, max_tokens, tag=None, session=None, **_):
        from kvdiag.runners.replay.shadow import namespace, tenant_of
        from reference_engine.provenance import Fingerprints
        from reference_engine.sequence import RequestStats

        req = self.index[(tag.session, tag.round)]
        t0 = time.perf_counter()
        request = self.api.make_request(f"{tag.session}-{tag.round + 1}-{self.epoch}", prompt_ids,
                                        len(req.output_ids), self.cfg.block_size, req.cache_salt,
                                        lora=req.lora, prompt_logprobs=req.prompt_logprobs)
        self.manager_seconds += time.perf_counter() - t0
        turn = VllmTurn(tag, request, req.output_ids,
                        Fingerprints(prompt_ids, namespace(req.lora, self.epoch)),
                        RequestStats(prompt_tokens=len(prompt_ids)), tenant=tenant_of(req.cache_salt))
        self.waiting.append(turn)
        return turn

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- scheduling --------------------------------------------------------------------
    def _allocate(self, turn: VllmTurn, num_new: int, hits: int = 0, blocks=None,
                  had: int = 0, admission: bool = False) -> list[int] | None:
        t0 = time.perf_counter()
        try:
            return self.api.allocate(self.manager, turn.request, num_new, hits, blocks,
                                     delay_cache=self.cache_after_compute, admission=admission)
        except AssertionError as e:  # vLLM's own check fired: record it, keep what it did
            self._violation(f"vLLM assertion in {assertion_site(e)} while allocating for {turn.label}")
            table = self.api.block_table(self.manager, turn.request.request_id)
            return table[had + hits // self.cfg.block_size:]
        finally:
            self.manager_seconds += time.perf_counter() - t0

    def reset_prefix_cache(self) -> bool:
        """vLLM's own reset, as after a weight update: K/V written before it are now another
        model's (the epoch changes the fingerprints of what comes after)."""
        done = bool(self.manager.reset_prefix_cache())
        self.epoch += 1
        if self.invariants is not None:
            self.invariants.forget()
        return done

    def _violation(self, message: str) -> None:
        if self.invariants is not None:
            self.invariants.add(self.num_steps, message)
        else:
            raise KvdiagError(message)

    def _preempt(self, turn: VllmTurn) -> None:
        """vLLM's own Scheduler._preempt_request (free, PREEMPTED, progress reset)."""
        t0 = time.perf_counter()
        self.api.preempt(self.manager, turn.request)
        self.manager_seconds += time.perf_counter() - t0
        turn.stats.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(turn)

    def _admit(self, budget: int) -> tuple[VllmTurn, int, list[int]] | None:
        turn = self.waiting[0]
        req, api, bs = turn.request, self.api, self.cfg.block_size
        t0 = time.perf_counter()
        progress = req.num_computed_tokens  # vLLM looks up only for a request at 0
        blocks, hits = api.lookup(self.manager, req) if not progress else (None, 0)
        counted = api.take_stats(self.manager) if api.stats_at_lookup else None
        self.manager_seconds += time.perf_counter() - t0
        if self.shadow is not None and hits and turn.first_admission:
            turn.hit_blocks = api.block_ids(blocks)
            if req.sampling_params.prompt_logprobs is not None:
                self.prompt_logprob_hits += 1
                self._violation(f"{turn.label}: asked for prompt logprobs and was served {hits} "
                                "tokens from the prefix cache (their logprobs are never computed)")
        if counted is not None:  # 0.17 counts every lookup, admitted or not
            self.cache_stats.add(counted)
        num_new = self._chunk(req.num_tokens - progress - hits, budget)
        new = self._allocate(turn, num_new, hits, blocks, admission=True)
        if new is None:
            return None
        self.waiting.popleft()
        t0 = time.perf_counter()
        if counted is None:  # 0.33 counts the lookup once the request is admitted
            if not progress:
                api.record_admission(self.manager, req, hits)
            counted = api.take_stats(self.manager)
            self.cache_stats.add(counted)
        self.manager_seconds += time.perf_counter() - t0
        req.status = api.RequestStatus.RUNNING
        req.num_computed_tokens = progress + hits
        self.running.append(turn)
        if turn.first_admission:  # the request's reuse, as vLLM's own statistics count it
            turn.first_admission = False
            turn.admitted, self.num_admitted = self.num_admitted, self.num_admitted + 1
            st = turn.stats
            st.cached_tokens, st.blocks_hit = counted.hits, counted.hits // bs
            st.blocks_needed = cdiv(req.num_prompt_tokens, bs)
            if counted.hits != hits:
                self._violation(f"{turn.label}: vLLM's PrefixCacheStats counted {counted.hits} "
                                f"hit tokens, get_computed_blocks returned {hits}")
        turn.stats.blocks_allocated += len(new)
        return turn, num_new, new

    def _chunk(self, remaining: int, budget: int) -> int:
        """The tokens one request is scheduled this step (vLLM caps a long prefill's chunk
        at long_prefill_token_threshold when another request is eligible)."""
        if 0 < self.long_prefill < remaining and len(self.running) + len(self.waiting) > 1:
            remaining = self.long_prefill
        return min(remaining, budget)

    def schedule(self) -> tuple[list[tuple[VllmTurn, int]], list[VllmTurn]]:
        self.api.new_step(self.manager)
        budget, scheduled, preempted = self.cfg.max_num_batched_tokens, [], []
        i = 0
        while i < len(self.running) and budget > 0:
            turn = self.running[i]
            req = turn.request
            num_new = self._chunk(req.num_tokens - req.num_computed_tokens, budget)
            had = len(self.api.block_table(self.manager, req.request_id)) if self.check else 0
            new = None
            while new is None:
                new = self._allocate(turn, num_new, had=had)
                if new is None:
                    victim = self.running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is turn:
                        break
            if new is None:
                break
            if self.shadow is not None:
                self.shadow.allocate(new)
            turn.stats.blocks_allocated += len(new)
            scheduled.append((turn, num_new))
            budget -= num_new
            i += 1
        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.cfg.max_num_seqs):
            admitted = self._admit(budget)
            if admitted is None:
                break
            turn, num_new, new = admitted
            if self.shadow is not None:
                self.shadow.allocate(new)
            scheduled.append((turn, num_new))
            budget -= num_new
        return scheduled, preempted

    # --- the step ----------------------------------------------------------------------
    def step(self) -> list[VllmTurn]:
        self.num_steps += 1
        scheduled, preempted = self.schedule()
        if not scheduled:
            if self.has_unfinished() and not preempted:
                raise KvdiagError("no request can be scheduled: the pool (num_blocks) is too small")
            return []
        if self.shadow is not None:
            items = []
            for turn, n in scheduled:
                table = self.api.block_table(self.manager, turn.request.request_id)
                items.append(StepItem(table, turn.request.num_computed_tokens, n,
                                      turn.fingerprints, turn.reads, turn.stats, turn.tenant))
                self.invariants.wrote(table, turn.request.num_computed_tokens, n, turn.label)
            self.shadow.step(items, self.num_steps)
            for turn, _ in scheduled:  # a cache hit on blocks another cache_salt wrote is a leak
                if turn.hit_blocks:
                    self.cross_tenant_hits += self.shadow.cross_tenant(turn.hit_blocks, turn.tenant)
                    turn.hit_blocks = []
        finished = []
        for turn, n in scheduled:
            req = turn.request
            samples = req.num_computed_tokens + n == req.num_tokens
            req.num_computed_tokens += n
            if self.cache_after_compute:
                self.api.cache(self.manager, req, req.num_computed_tokens)
            if self.check:
                self.invariants.learn_hashes(turn)
            if not samples:
                continue
            token = turn.teacher[len(req.output_token_ids)]
            t0 = time.perf_counter()
            req.append_output_token_ids(token)  # vLLM hashes any block this token fills
            self.manager_seconds += time.perf_counter() - t0
            turn.fingerprints.append(token)
            if len(req.output_token_ids) == len(turn.teacher):
                self.running.remove(turn)
                req.status = self.api.RequestStatus.FINISHED_STOPPED
                t0 = time.perf_counter()
                self.manager.free(req)
                self.manager_seconds += time.perf_counter() - t0
                finished.append(turn)
        if self.check:
            self.invariants.check(self.num_steps, [self.api.block_table(self.manager, t.request.request_id)
                                                   for t in self.running])
        return finished


def replay_vllm(trace: Trace, *, api: VllmApi | None = None, check: bool = True,
                cache_after_compute: bool = False, epilogue: bool = False,
                long_prefill_token_threshold: int = 0) -> ReplayResult:
    """The trace through the installed vLLM's KVCacheManager; rows target "vllm-<version>",
    allocator "vllm". `epilogue`: then the isolation and reset checks of epilogue.py, on the
    same manager (stats["epilogue"])."""
    api = api or load()
    engine = VllmReplay(trace, api, check=check, cache_after_compute=cache_after_compute,
                        long_prefill_token_threshold=long_prefill_token_threshold)
    t0 = time.perf_counter()
    turns = drive(trace, engine)
    after = None
    if epilogue and check:
        from kvdiag.runners.replay.epilogue import run_epilogue

        after = run_epilogue(engine, trace)
    seconds = time.perf_counter() - t0
    s, inv = engine.cache_stats, engine.invariants
    stats = {"vllm_version": api.version, "prefix_cache_requests": s.requests,
             "prefix_cache_queries": s.queries, "prefix_cache_hits": s.hits,
             "prefix_cache_hit_rate": s.hit_rate, "preempted_requests": s.preempted_requests,
             "preempted_queries": s.preempted_queries, "preempted_hits": s.preempted_hits,
             "preemptions": engine.num_preemptions, "manager_seconds": engine.manager_seconds,
             "invariant_violations": inv.count if inv is not None else 0,
             "recycled_blocks": engine.shadow.recycled_blocks if engine.shadow is not None else 0,
             "cross_tenant_hits": engine.cross_tenant_hits,
             "prompt_logprob_hits": engine.prompt_logprob_hits} | ({"epilogue": after} if after is not None else {})
    violations = inv.messages if inv is not None else []
    return ReplayResult(api.label, ALLOCATOR, records(trace, turns, target=api.label, allocator=ALLOCATOR),
                        engine.num_steps, seconds, turns, stats, violations)
