"""One probe of a live endpoint, start to finish: plan with the server's tokenizer, the
shared, isolated and noise-floor phases (resumable), and the records and summary. Library
code: `kvdiag probe` and `kvdiag regress` render and gate what it returns."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import EndpointError, KvdiagError
from kvdiag.lifecycle import RunResult
from kvdiag.runners import probe as P
from kvdiag.suites import Case, Suite


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
              progress: Callable[[str, int, int], None] | None = None):
    """The probe as a RunResult (summary without command/created/wall time: finish_run adds
    them)."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize
    from kvdiag.runners.plan import plan_case
    from kvdiag.runs import signature

    settings = settings or P.ProbeSettings()
    if count_with not in ("tokenize", "usage"):
        raise KvdiagError(f"--count-with must be tokenize or usage, got {count_with!r}")
    endpoint = P.Endpoint(base_url, model, api_key)
    endpoint.check()
    server = P.read_server_cache(endpoint, suite.block_size, block_size=settings.block_size,
                                 num_blocks=settings.num_blocks)
    meta_path = run_dir / "probe.json"
    meta = None
    if resume:
        if not meta_path.is_file():
            raise KvdiagError(f"{run_dir}: not a probe run directory (no probe.json)")
        meta = json.loads(meta_path.read_text())
    tokenizer = P.RemoteTokenizer(endpoint, use_usage=count_with == "usage")
    plan = plan_case(suite, case, tokenizer, block_size=server.block_size)
    if tokenizer.use_usage:
        warn("counting tokens by usage.prompt_tokens (no /tokenize): planning sends one-token requests")
    salted, why = endpoint.salt_supported()
    if not salted:
        if not endpoint.reset_prefix_cache():
            raise EndpointError(f"{base_url} rejects cache_salt ({why}) and has no /reset_prefix_cache: "
                                "no isolated ground truth can be made")
        warn(f"the server rejects cache_salt ({why}); isolated runs reset the prefix cache "
             "before each request and run one at a time")
    fresh = {"base_url": base_url, "model": model, "suite": suite.name, "case": case.name,
             "plan_sha": plan_sha(plan), "salted": salted}
    if meta is not None and meta["plan_sha"] != fresh["plan_sha"]:
        raise KvdiagError(f"{run_dir}: the suite or the server's tokenizer changed since this probe began")
    store = P.RoundStore(run_dir / "rounds.jsonl")
    jobs = [(k, r) for k in range(len(plan.sessions)) for r in range(case.rounds)]
    floor = P.floor_jobs(plan, settings.floor_sessions)
    pressure = P.plan_pressure(plan, server, salted, settings)
    total, done = 2 * len(jobs) + len(floor) + len(pressure) * case.rounds, [len(store.done)]

    def tick_for(phase: str):
        def tick():
            done[0] += 1
            if progress:
                progress(phase, done[0], total)
        return tick

    # the server's counters when the probe began; kept in probe.json so that a resumed
    # probe's prefix-cache hit rate still covers the whole run
    before = _counters_since(meta, endpoint.metrics())
    kept = meta is not None and before is meta.get("metrics_before")
    meta = (meta if kept else fresh | {"metrics_after_shared": None}) | {"metrics_before": before}
    meta_path.write_text(json.dumps(meta, indent=2))
    after_shared = {}

    async def run_all():
        try:
            await P._phase_shared(endpoint, plan, store, settings, tick_for("shared (cache on)"),
                                  pressure)
            after_shared.update(meta.get("metrics_after_shared") or endpoint.metrics())
            meta["metrics_after_shared"] = after_shared  # a resume after this point keeps it
            meta_path.write_text(json.dumps(meta, indent=2))
            await P._phase_isolated(endpoint, plan, store, settings, P.ISOLATED, jobs, salted,
                                    tick_for("isolated (fresh cache_salt)"))
            await P._phase_isolated(endpoint, plan, store, settings, P.FLOOR, floor, salted,
                                    tick_for("noise floor"))
        finally:
            await endpoint.aclose()

    try:
        asyncio.run(run_all())
    finally:
        store.close()
    worst, diverged, pairs = P.noise_floor(store)
    threshold = max(worst, settings.numerics_margin)
    frame = pd.DataFrame([r.as_dict() for r in P.records(plan, store, base_url, threshold,
                                                         plan.style, server.block_size, pressure)])
    summary = summarize(frame, baseline=None)  # a live server has no guarded series
    shared = frame[frame["allocator"] == P.SHARED]
    corrupt = shared[shared["classification"] == "corruption"]
    numerics = shared[shared["classification"] == "numerics"]
    key_q, key_h = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
    dq = after_shared.get(key_q, 0) - before.get(key_q, 0)
    dh = after_shared.get(key_h, 0) - before.get(key_h, 0)
    summary.update({
        "signature": signature(engine=f"endpoint:{base_url}", allocators=[P.SHARED, P.ISOLATED],
                               block_size=server.block_size, model=model, suite=suite.name, seed=suite.seed),
        "suite": suite.name, "cases": [case.name], "style": plan.style, "targets": [base_url],
        "model": model,
        "verdict": "fail" if len(corrupt) else "pass",
        "corruption_rounds": sorted({int(x) for x in corrupt["round"]}),
        "corrupted_requests": int(len(corrupt)), "numerics_requests": int(len(numerics)),
        "noise_floor": {"margin": worst, "diverged_pairs": diverged, "pairs": pairs, "threshold": threshold},
        "isolation": "cache_salt" if salted else "reset_prefix_cache",
        "server_prefix_cache": {"queries": dq, "hits": dh, "hit_rate": (dh / dq) if dq else None},
    })
    summary.update(P.server_summary(store, plan, server, pressure, before, after_shared, corrupt))
    return RunResult("probe", frame, summary)


def _counters_since(meta: dict | None, now: dict) -> dict:
    """The server's counters when this probe began: those saved in probe.json when resuming
    against the same server process, so that the prefix-cache hit rate covers the whole run.
    A restarted server's counters start again from zero (lower than saved): then only the
    counters from now on are comparable."""
    saved = (meta or {}).get("metrics_before")
    key = "vllm:prefix_cache_queries_total"
    if saved and now.get(key, 0) >= saved.get(key, 0):
        return saved
    return now

