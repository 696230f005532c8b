"""One probe of a live endpoint, start to finish, as facts: plan with the server's tokenizer,
the shared, isolated and noise-floor phases (resumable through rounds.jsonl and probe.json),
and the records. Returns what was measured; kvdiag.commands.probe judges it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.planning.suites import Case, Suite
from kvdiag.record import evidence as E
from kvdiag.record.summary_rows import EventRow
from kvdiag.runners.live import compare as C
from kvdiag.runners.live import differential as D
from kvdiag.runners.live import lifecycle as L
from kvdiag.runners.live import lifeplan as LP
from kvdiag.runners.live import phases as P
from kvdiag.runners.live import sentinel as S
from kvdiag.runners.live import slotlife as SL
from kvdiag.runners.live.connect import connect, counters_since, isolation
from kvdiag.runners.live.coverage import differential_records, key_coverage
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.events import coverage as event_coverage
from kvdiag.runners.live.pressure import ServerCache, observe_recycling
from kvdiag.runners.live.probe_facts import ProbeRun
from kvdiag.runners.live.store import RoundStore
from kvdiag.runners.live.tokenizer import RemoteTokenizer
from kvdiag.runners.records import Record
from kvdiag.sentinel.log import size_of


def plan_sha(plan) -> str:
    h = hashlib.sha256()
    for session in plan.prompts:
        for ids in session:
            h.update(json.dumps(ids).encode())
    return h.hexdigest()[:16]


def run_probe(base_url: str, model: str, suite: Suite, case: Case, run_dir: Path, *,
              api_key: str | None = None, settings: P.ProbeSettings | None = None,
              resume: bool = False, warn: Callable[[str], None] = lambda _m: None,
              count_with: str = "tokenize",
              progress: Callable[[str, int, int], None] | None = None) -> ProbeRun:
    """The probe, measured into `run_dir` (rounds.jsonl, probe.json)."""
    settings = settings or P.ProbeSettings()
    if count_with not in ("tokenize", "usage"):
        raise KvdiagError(f"--count-with must be tokenize or usage, got {count_with!r}")
    meta_path = run_dir / "probe.json"
    if resume and not meta_path.is_file():
        raise KvdiagError(f"{run_dir}: not a probe run directory (no probe.json)")
    meta = json.loads(meta_path.read_text()) if resume else None
    endpoint, who, server = connect(base_url, model, api_key, suite, settings)
    plan, salted, settings, ids_known = _plan(endpoint, suite, case, server, settings, count_with, warn)
    fresh = {"base_url": base_url, "model": model, "suite": suite.name, "case": case.name,
             "plan_sha": plan_sha(plan), "salted": salted, "adapter": settings.adapter,
             "twins": settings.twins}
    if meta is not None and meta["plan_sha"] != fresh["plan_sha"]:
        raise KvdiagError(f"{run_dir}: the suite or the server's tokenizer changed since this probe began")
    store = RoundStore(run_dir / "rounds.jsonl")
    # pressure sessions and the lifecycle phase keep their requests apart by cache_salt: an
    # engine without namespaces (llama.cpp) serves them all from one cache, so neither runs
    spaced = salted and endpoint.protocol.namespaces
    pressure = P.plan_pressure(plan, server, spaced, settings)
    life = _plan_lifecycle(endpoint, plan, server, spaced, salted and ids_known, settings, warn)
    # the server's counters when the probe began; kept in probe.json so that a resumed
    # probe's prefix-cache hit rate still covers the whole run
    before = counters_since(meta, endpoint.metrics(), who["counters"].queries)
    kept = meta is not None and before is meta.get("metrics_before")
    meta = (meta if kept else fresh | {"metrics_after_shared": None}) | {"metrics_before": before}
    if settings.sentinel and "sentinel_since" not in meta:  # kept by a resumed run
        meta["sentinel_since"] = size_of(settings.sentinel)  # where this run begins reading
    meta_path.write_text(json.dumps(meta, indent=2))
    try:
        after = asyncio.run(_phases(endpoint, plan, store, settings, salted, pressure, meta,
                                    meta_path, progress, life))
    finally:
        store.close()
    sentinel, bad_reads = (S.observe(settings.sentinel, meta["sentinel_since"], store)
                           if settings.sentinel else (None, {}))
    run = _facts(base_url, who, plan, store, server, salted, pressure, before, after, settings,
                 bad_reads)
    if sentinel is not None and Path(sentinel.source).parent == run_dir:
        sentinel.source = Path(sentinel.source).name  # in the run directory, whatever it is called
    run.sentinel = sentinel
    run.traffic = E.Traffic(spread=settings.spread, twins=settings.twins, adapter=settings.adapter,
                          prompt_logprobs=settings.prompt_logprobs,
                          twin_requests=sum(phase == P.TWIN for phase, _, _ in store.done),
                          isolation=endpoint.protocol.isolation if salted else "reset_prefix_cache",
                          namespaces=endpoint.protocol.namespaces, differential=settings.differential,
                          differential_only=settings.differential_only, lifecycle=life is not None,
                          require=list(settings.require))
    run.key_coverage = key_coverage(plan, store, pressure, server, meta, ids_known,
                                    namespaces=run.traffic.namespaces,
                                    reuse_chunk=settings.reuse_chunk, life=life)
    divergences = C.lifecycle_divergences(store)
    run.lifecycle = E.Lifecycle(
        events=[EventRow(**row) for row in event_coverage(
            store, life, meta.get("life_observed") or {}, run.recycling, before,
            meta.get("metrics_after_life") or after)],
        divergences=divergences, requests=len(divergences),
        sizing=life.sizing if life else {}, skipped=life.skipped if life else {},
        required=list(settings.require))
    run.topk = C.topk_channel(plan, store, pressure)
    return run


def _plan_lifecycle(endpoint: Endpoint, plan, server: ServerCache, spaced: bool, twins: bool,
                    settings: P.ProbeSettings, warn: Callable[[str], None]) -> LP.LifePlan | None:
    """The lifecycle phase's requests for this server, or None where it does not run (asked
    off, the differential phase alone, no token ids or isolated twins, or, on a paged
    engine, no salts to keep its requests apart). An engine of slots (llama.cpp) gets the
    slot events' phase (slotlife.py), sent one request at a time, so it needs no salts."""
    if not settings.lifecycle or settings.differential_only:
        return None
    if endpoint.protocol.slots and twins:
        slots = server.flags.get("total_slots")
        return SL.plan_slots([list(map(list, s)) for s in plan.prompts],
                             slots if isinstance(slots, int) else None, settings.reuse_chunk,
                             failed_restore=settings.slot_files is not None)
    last = [session[-1] for session in plan.prompts]
    material = [t for prompt in last for t in prompt]
    ends = tuple(itertools.accumulate(len(prompt) for prompt in last))
    if not (spaced and twins):
        warn("the lifecycle phase needs namespaces (cache_salt) and /tokenize: it is off, and "
             "its events are reported not reached")
        return None
    context, chunk = L.server_limits(endpoint, settings.prefill_chunk)
    return LP.plan_lifecycle(material, server.block_size, server.num_blocks, context, chunk,
                             settings.concurrency, ends)


def _plan(endpoint: Endpoint, suite: Suite, case: Case, server: ServerCache,
          settings: P.ProbeSettings, count_with: str, warn: Callable[[str], None]):
    """(the case planned with the server's tokenizer at its block size, whether isolated runs
    are salted, the settings as this server allows them)."""
    from kvdiag.planning.plan import plan_case

    tokenizer = RemoteTokenizer(endpoint, use_usage=count_with == "usage")
    plan = plan_case(suite, case, tokenizer, block_size=server.block_size, spread=settings.spread,
                     adapter=settings.adapter)
    if tokenizer.use_usage:
        warn("counting tokens by usage.prompt_tokens (no /tokenize): planning sends one-token requests")
    salted = isolation(endpoint, endpoint.base, warn, settings.isolation)
    if settings.prompt_logprobs and (tokenizer.use_usage or not endpoint.protocol.prompt_logprobs
                                     or not endpoint.prompt_logprobs_supported(P.plp_ids(plan, 0, 0))):
        # placeholder ids, or a server without prompt logprobs (asked only of a server that
        # may have them: on one cache without namespaces the question's prompt would be a
        # source of hits the over-hit oracle never saw)
        settings = dataclasses.replace(settings, prompt_logprobs=False)
    if settings.differential and (tokenizer.use_usage or not salted):
        warn("no /tokenize: the differential phase needs token ids (and the over-hit oracle too)"
             if tokenizer.use_usage else "the server rejects cache_salt: the differential phase, "
             "which keeps its pairs in namespaces of their own, is off")
        settings = dataclasses.replace(settings, differential=False)
    return plan, salted, settings, not tokenizer.use_usage


async def _phases(endpoint: Endpoint, plan, store: RoundStore, settings: P.ProbeSettings,
                  salted: bool, pressure: list[int], meta: dict, meta_path: Path,
                  progress: Callable[[str, int, int], None] | None, life: LP.LifePlan | None) -> dict:
    """The differential phase first (one request at a time, its own salts); then the shared,
    isolated, noise-floor (and prompt-logprob) phases, or none of them with
    `differential_only`. Returns the server's counters after the shared phase."""
    only = settings.differential_only
    jobs = [] if only else [(k, r) for k in range(len(plan.sessions)) for r in range(plan.case.rounds)]
    floor = [] if only else P.floor_jobs(plan, settings.floor_sessions)
    plp = P.plp_jobs(plan) if settings.prompt_logprobs and not only else []
    block = plan.schedule.block_size  # the server's, as the plan was made for it
    diff = len(D.pairs(_material(plan), block, settings.adapter)) if settings.differential else 0
    total = diff + 2 * len(jobs) + len(floor) + len(pressure) * plan.case.rounds * (not only) + len(plp)
    total += 2 * len(life.requests) if life else 0
    done = [len(store.done)]

    def tick_for(phase: str):
        def tick():
            done[0] += 1
            if progress:
                progress(phase, done[0], total)
        return tick

    def save(key: str, value) -> None:  # kept in probe.json, for a resumed run
        meta[key] = value
        meta_path.write_text(json.dumps(meta, indent=2))

    try:
        if settings.differential:
            resets, skipped = meta.setdefault("resets", []), []
            await D.differential_phase(endpoint, _material(plan), block, store,
                                       namespaces=endpoint.protocol.namespaces,
                                       adapter=settings.adapter, max_tokens=settings.differential_tokens,
                                       top_logprobs=settings.top_logprobs, resets=resets,
                                       skipped=skipped, tick=tick_for("differential (key coverage)"))
            save("resets", resets)
            save("differential_skipped", sorted(set(meta.get("differential_skipped", []) + skipped)))
        if only:
            return endpoint.metrics()
        shared_salt = meta.get("shared_salt")
        if shared_salt is None and salted:
            shared_salt = f"kvdiag-run-{uuid.uuid4().hex[:12]}"
        elif (shared_salt is None and meta.get("metrics_after_shared") is None
              and endpoint.reset_prefix_cache()):
            # no salts: the oracle must know every request that could have written a block the
            # shared phase hits, so the phase starts from an empty cache
            meta.setdefault("resets", []).append(time.time())
        save("shared_salt", shared_salt)
        await P.shared_phase(endpoint, plan, store, settings, tick_for("shared (cache on)"), pressure,
                             shared_salt=shared_salt)
        after = meta.get("metrics_after_shared") or endpoint.metrics()
        save("metrics_after_shared", after)  # a resume after this point keeps it
        if life is not None and meta.get("metrics_after_life") is None:
            observed = meta.get("life_observed") or {}
            if life.kind == "slots":
                await SL.slots_phase(endpoint, life, store, tick_for("lifecycle (slot events)"), observed)
            else:
                await L.lifecycle_phase(endpoint, life, store, shared_salt or "kvdiag-life",
                                        tick_for("lifecycle (events)"), observed)
            save("life_observed", observed)
            save("metrics_after_life", endpoint.metrics())
        for phase, work, what in ((P.ISOLATED, jobs, "isolated (fresh cache_salt)"),
                                  (P.FLOOR, floor, "noise floor"), (P.PLP_ISOLATED, plp, "prompt logprobs")):
            await P.isolated_phase(endpoint, plan, store, settings, phase, work, salted, tick_for(what))
        if life is not None:
            await L.lifecycle_isolated(endpoint, life, store, settings.concurrency,
                                       tick_for("lifecycle (isolated)"))
    finally:
        await endpoint.aclose()
    return after


def _material(plan) -> list[int]:
    """The differential phase's token ids: the suite's longest prompt (any model's vocabulary)."""
    return max((ids for session in plan.prompts for ids in session), key=len)


def _facts(base_url, who, plan, store, server, salted, pressure, before, after,
           settings, bad_reads) -> ProbeRun:
    import pandas as pd

    rows = (differential_records(store, base_url, server.block_size)
            if settings.differential_only else
            C.records(plan, store, base_url, plan.style, server.block_size, pressure, bad_reads))
    frame = pd.DataFrame([r.as_dict() for r in rows], columns=Record.columns())
    shared = {(phase, k, r): row for (phase, k, r), row in store.done.items()
              if phase in (P.SHARED, P.PRESSURE)}
    slots = server.flags.get("total_slots")
    recycling = observe_recycling(shared, server.block_size, before, after, who["counters"],
                                  slots=slots if isinstance(slots, int) else None)
    recycling.pressure_sessions = len(pressure)
    if settings.differential_only:
        recycling.how = "not measured: the differential phase alone needs no recycling"
    queries, hits = (after.get(n, 0) - before.get(n, 0) for n in who["counters"].names)
    return ProbeRun(
        frame=frame, plan=plan, model_label=who["model_label"], server=server,
        engine=who["engine"], salted=salted, pressure=pressure, recycling=recycling,
        noise_floor=C.noise_floor(store, settings.numerics_margin),
        ground_truth=C.ground_truth(store),
        prompt_logprobs=C.prompt_logprob_pairs(store),
        prefix_cache={"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None},
        store=store)
