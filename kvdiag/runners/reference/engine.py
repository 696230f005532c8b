"""The in-process runner: a case's sessions through the contiguous reference (ground truth)
and through the paged engine under each allocator, one record per (allocator, session,
round)."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from kvdiag.errors import KvdiagError
from kvdiag.metrics.decay import first_divergence
from kvdiag.planning.plan import CasePlan
from kvdiag.runners.records import Checker, Record
from kvdiag.vocab import CONTIGUOUS


@dataclass
class CaseResult:
    plan: CasePlan
    records: list[Record] = field(default_factory=list)
    engine_log: dict[str, list[str]] = field(default_factory=dict)  # allocator -> lines
    seconds: dict[str, float] = field(default_factory=dict)  # wall per allocator (overlapping
    # when they run side by side) and for the contiguous reference
    reference_cache: str = "off"  # "hit", "miss" (computed and stored) or "off" (not used)
    evicted: dict[str, int] = field(default_factory=dict)  # allocator -> cached blocks recycled


class _LogCapture(logging.Handler):
    """The engine's log lines, kept apart per thread: allocators may run side by side."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: dict[int, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.setdefault(record.thread, []).append(record.getMessage())


def allocator_workers(allocators: list[str], device: str) -> int:
    """How many allocators run at once: on CPU, one per intra-op thread torch would use
    (each then runs single-threaded: two engines on two cores finish sooner than two in turn
    on both, since a step's small kernels and Python leave cores idle). Outputs are equal
    either way. KVDIAG_ALLOCATOR_WORKERS=1 runs them in turn."""
    wanted = workers_setting()
    if device != "cpu" or len(allocators) < 2:
        return 1
    import torch

    return max(1, min(len(allocators), wanted or torch.get_num_threads()))


def workers_setting() -> int | None:
    """KVDIAG_ALLOCATOR_WORKERS as a number, None when unset; KvdiagError when it is not a
    whole number of at least 1."""
    wanted = os.environ.get("KVDIAG_ALLOCATOR_WORKERS", "")
    if wanted and not (wanted.isdigit() and int(wanted) >= 1):
        raise KvdiagError(f"KVDIAG_ALLOCATOR_WORKERS={wanted!r}: give a whole number of at least 1")
    return int(wanted) if wanted else None


def _engine_config(plan: CasePlan, allocator: str, device: str, dtype: str | None,
                   check_integrity: bool = False):
    from reference_engine.config import EngineConfig

    s, case = plan.schedule, plan.case
    longest = max(max(p) for p in s.prompt_lengths) + case.max_tokens
    return EngineConfig(
        block_size=s.block_size, num_blocks=s.num_blocks, max_num_seqs=plan.suite.max_num_seqs,
        max_model_len=longest, enable_prefix_caching=s.enable_prefix_caching, allocator=allocator,
        device=device, dtype=dtype, capture_attention=case.capture_attention,
        recycled_block_fill=case.recycled_block_fill, check_integrity=check_integrity)


def run_case(plan: CasePlan, checkpoint, allocators: list[str], *, device: str = "cpu",
             dtype: str | None = None, spacy_model: str | None = None,
             progress: Callable[[int], None] | None = None, use_cache: bool = True,
             check_integrity: bool = False) -> CaseResult:
    """Run the contiguous reference, then each allocator, on the plan's prompts (on CPU,
    the allocators side by side: see allocator_workers).

    use_cache: read the contiguous reference from the on-disk cache when an entry for
    exactly these prompts, weights, engine and settings exists, and store it after
    computing it (runners/reference/cache.py); False computes it and touches no cache.
    check_integrity: every allocator invariant checked after every engine step."""
    from reference_engine.engine import LLMEngine
    from reference_engine.sessions import fixed_prompts, run_sessions

    result = CaseResult(plan)
    sessions, prompts, case = plan.sessions, plan.prompts, plan.case
    tok = checkpoint.tokenizer
    checker = Checker(plan.style, spacy_model)
    keys = list(range(len(sessions)))

    ticks = threading.Lock()

    def tick(_seq):
        if progress:
            with ticks:
                progress(1)

    def one(name: str, stop: threading.Event) -> tuple[dict, float, list[str], int]:
        def on_step():
            if stop.is_set():
                raise _Stopped

        t0 = time.perf_counter()
        engine = LLMEngine(checkpoint, _engine_config(plan, name, device, dtype, check_integrity))
        turns = run_sessions(engine, keys, fixed_prompts(prompts), max_tokens=case.max_tokens,
                             think_steps=plan.schedule.think, on_finish=tick, on_step=on_step)
        return (turns, time.perf_counter() - t0, capture.lines.pop(threading.get_ident(), []),
                engine.allocator.num_evicted)

    capture = _LogCapture()
    logger = logging.getLogger("reference_engine")
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        t0 = time.perf_counter()
        reference, result.reference_cache = _reference(plan, checkpoint, device, dtype, use_cache, tick)
        result.seconds[CONTIGUOUS] = time.perf_counter() - t0
        result.records += _records(plan, CONTIGUOUS, reference, reference, tok, checker)
        capture.lines.clear()
        for name, (turns, seconds, lines, evicted) in zip(allocators, _map(one, allocators, device)):
            result.seconds[name], result.engine_log[name] = seconds, lines
            result.evicted[name] = evicted
            result.records += _records(plan, name, turns, reference, tok, checker)
    finally:
        logger.removeHandler(capture)
    return result


class _Stopped(Exception):
    """Raised in an allocator's run at its next step once another one has failed."""


def _map(fn: Callable, allocators: list[str], device: str) -> list:
    """fn(name, stop) over the allocators, side by side where allocator_workers allows (each
    then with an equal share of torch's threads), in order otherwise. The first failure (an
    error, IntegrityError, Ctrl-C) sets `stop`, so the others end at their next step rather
    than run to the end, and is the one raised."""
    import torch

    stop = threading.Event()
    workers = allocator_workers(allocators, device)
    if workers == 1:
        return [fn(name, stop) for name in allocators]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // workers))
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="allocator") as pool:
            futures = [pool.submit(fn, name, stop) for name in allocators]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # a failure, or Ctrl-C here
                if not all(f.done() and f.exception() is None for f in futures):
                    stop.set()
            wait(futures)
        failed = [f.exception() for f in futures if f.exception() is not None]
        first = next((e for e in failed if not isinstance(e, _Stopped)), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]
    finally:
        torch.set_num_threads(threads)


def _reference(plan: CasePlan, checkpoint, device: str, dtype: str | None, use_cache: bool,
               tick: Callable) -> tuple[dict, str]:
    """The contiguous reference's turns {session index: [turn per round]}, from the cache
    or computed, and what the cache did ("hit", "miss", "off")."""
    from kvdiag.runners.reference import cache as reference_cache
    from reference_engine.config import EngineConfig
    from reference_engine.contiguous import ContiguousEngine
    from reference_engine.sessions import fixed_prompts, run_sessions

    config = EngineConfig(device=device, dtype=dtype, max_num_seqs=plan.suite.max_num_seqs)
    if use_cache:
        key = reference_cache.cache_key(plan, checkpoint, config, plan.case.max_tokens)
        path = reference_cache.cache_path(plan, key)
        cached = reference_cache.load(path, key, plan)
        if cached is not None:
            for turns in cached:
                for turn in turns:
                    tick(turn)
            return dict(enumerate(cached)), "hit"
    engine = ContiguousEngine(checkpoint, config)
    keys = list(range(len(plan.sessions)))
    turns = run_sessions(engine, keys, fixed_prompts(plan.prompts), max_tokens=plan.case.max_tokens,
                         on_finish=tick)
    if not use_cache:
        return turns, "off"
    reference_cache.store(path, key, turns)
    return turns, "miss"


def _records(plan: CasePlan, allocator: str, turns, reference, tok, checker: Checker) -> list[Record]:
    out = []
    for s, session in enumerate(plan.sessions):
        for r, rnd in enumerate(session.rounds):
            seq, ref = turns[s][r], reference[s][r]
            st = seq.stats
            text = tok.decode(seq.output_ids).strip()
            passed, reason = checker.check(session.kb, rnd, text)
            out.append(Record(
                case=plan.case.name, target="reference", allocator=allocator,
                session=session.session_id, round=r + 1, kind=rnd.kind,
                prompt_tokens=st.prompt_tokens, cached_tokens=st.cached_tokens,
                blocks_needed=st.blocks_needed, blocks_hit=st.blocks_hit,
                attention_leakage=(st.attention_leakage if st.leakage_tokens else math.nan),
                attention_leakage_max=(st.leakage_max if st.leakage_tokens else math.nan),
                foreign_slots=st.foreign_slots, unwritten_slots=st.unwritten_slots,
                guard_rejections=st.guard_rejections, nonfinite_logits=st.nonfinite_logits,
                preemptions=st.preemptions, output_text=text,
                reference_text=tok.decode(ref.output_ids).strip(), expected_text=rnd.expected,
                output_token_ids=list(seq.output_ids), reference_token_ids=list(ref.output_ids),
                first_divergence=first_divergence(seq.output_ids, ref.output_ids),
                fact_check_pass=passed, fact_check_reason=reason))
    return out
