"""Plan for the server the probe meets: its real block size and pool, pressure sessions when
the pool is too big for the suite alone to recycle, and whether recycling was observed.

The trigger needs freed blocks to be recycled while their session thinks. A suite sizes its
pool to hold the sessions' histories as they stand after `pressure_round` (scenarios.py); a
server's pool is whatever it was started with. When it is bigger, the probe adds pressure
sessions: replays of the suite's own sessions, each under its own cache_salt (so none of
their blocks is shared with anything else), until all sessions together fill the server's
pool at `pressure_round` as the suite's own sessions fill the suite's pool. A recycled
block may belong to any session, so pressure answers are checked too (against the isolated
twin of the session they replay: the same prompt, so the same greedy answer).

Recycling is then observed, not assumed:
    evictions from /metrics   a counter of evicted cache blocks rose during the shared pass
    cached fractions fell     a shared request got fewer cached tokens than the full blocks of
                              its own session's previous prompt: some of them were recycled
    slots handed over         a server of fixed slots (llama.cpp's /props total_slots) served
                              more conversations than it has slots: by pigeonhole, at least
                              (conversations - slots) times a slot's cells past the common
                              prefix were cleared and written by another conversation
A healthy server that recycled shows the second; a stale-hash fault can hide it (its stale
entries still "hit"), but then its answers diverge.
"""

from __future__ import annotations

from kvdiag.record.evidence import Recycling, ServerCache
from kvdiag.runners.live.endpoint import Endpoint
from reference_engine.util import cdiv


def read_server_cache(endpoint: Endpoint, suite_block_size: int, *, block_size: int | None = None,
                      num_blocks: int | None = None) -> ServerCache:
    """The server's block size and pool: its `vllm:cache_config_info` first; the user's flags
    where the server does not say; the suite's block size as the last resort."""
    labels = endpoint.cache_config()
    version = endpoint.version()

    def as_int(key: str) -> int | None:
        try:
            return int(labels[key])
        except (KeyError, ValueError):
            return None

    bs, pool = as_int("block_size"), as_int("num_gpu_blocks")
    if bs or pool:
        return ServerCache(block_size=bs or block_size or suite_block_size, num_blocks=pool or num_blocks,
                           source="cache_config_info", version=version, flags=labels)
    info = endpoint.server_info
    if info.get("max_total_num_tokens"):
        # SGLang: a radix tree over pages (of one token on CPU); plan in the suite's blocks
        # where pages are that small, and count the pool in the blocks planned with
        page = int(info.get("page_size") or 1)
        bs = block_size or (page if page > 1 else suite_block_size)
        flags = {"page_size": page, "max_total_num_tokens": int(info["max_total_num_tokens"])}
        return ServerCache(block_size=bs, num_blocks=num_blocks or int(info["max_total_num_tokens"]) // bs,
                           source="server_info", flags=flags,
                           version=str(info.get("version")) if info.get("version") else version)
    settings = endpoint.props.get("default_generation_settings") or {}
    if settings.get("n_ctx"):
        # llama.cpp: a KV cell per token, n_ctx of them (one context, its slots' sequences
        # in it); planned in the suite's blocks, as SGLang's one-token pages are
        bs = block_size or suite_block_size
        flags = {"n_ctx": int(settings["n_ctx"]), "total_slots": endpoint.props.get("total_slots")}
        return ServerCache(block_size=bs, num_blocks=num_blocks or int(settings["n_ctx"]) // bs,
                           source="props", version=endpoint.props.get("build_info") or version,
                           flags=flags)
    if block_size or num_blocks:
        return ServerCache(block_size=block_size or suite_block_size, num_blocks=num_blocks,
                           source="flags", version=version, flags=labels)
    return ServerCache(block_size=suite_block_size, source="suite", version=version, flags=labels)


def pressure_sessions(schedule, pool: int | None, pressure_round: int, *, limit: int) -> list[int]:
    """Which suite sessions to replay as pressure (index k of the list replays session
    list[k]): enough that the server's `pool` is as full at `pressure_round` as the
    schedule's own pool (`schedule.num_blocks`, at the server's block size) is with the suite
    alone. At most `limit`; [] when the pool is unknown or small enough already."""
    if pool is None or pool <= schedule.num_blocks:
        return []
    bs, n = schedule.block_size, schedule.num_sessions
    fit = min(pressure_round, schedule.num_rounds - 1)
    missing, out = pool - schedule.num_blocks, []
    while missing > 0 and len(out) < limit:
        k = len(out) % n
        out.append(k)
        # a salted replay shares nothing, its system prompt included
        missing -= cdiv(schedule.prompt_lengths[k][fit] + schedule.answer_lengths[k][fit] - 1, bs)
    return out


def observe_recycling(shared_rows: dict[tuple[int, int], dict], block_size: int,
                      before: dict[str, float], after: dict[str, float], counters,
                      slots: int | None = None) -> Recycling:
    """Whether the server recycled blocks during the shared pass, and how it shows.
    `shared_rows` maps (phase, session, round index) to the probe's stored row; `counters`
    names the engine's eviction counters (engines/spec.CacheCounters); `slots`: the server's
    fixed slot count, where it has one (llama.cpp)."""
    evictions = None
    for name in counters.evictions:
        if name in after:
            evictions = (evictions or 0.0) + after[name] - before.get(name, 0.0)
    fell = 0
    for (phase, k, r), row in shared_rows.items():
        # the latest earlier round sent under the same model (rounds may alternate with an
        # adapter, whose blocks the base model must not hit)
        prev = next((p for p in (shared_rows.get((phase, k, q)) for q in range(r - 1, -1, -1))
                     if p is not None and p.get("model") == row.get("model")), None)
        if prev is None or row.get("cached_tokens") is None:
            continue
        # every full block of the previous prompt was cached when it finished
        if row["cached_tokens"] < prev["prompt_tokens"] // block_size * block_size:
            fell += 1
    known = any(row.get("cached_tokens") is not None for row in shared_rows.values())
    # a conversation: a session, told apart by its first prompt's ids where the row has them
    # (two sessions of one prompt would hand a slot over without clearing anything)
    first: dict[tuple, tuple] = {}
    for (phase, k, _r), row in sorted(shared_rows.items(), key=lambda item: item[0][2]):
        first.setdefault((phase, k), tuple(row.get("ids") or ()) or (phase, k))
    conversations = len(set(first.values()))
    handovers = max(conversations - slots, 0) if slots else 0
    how = ("evictions from /metrics" if evictions else
           "cached fractions fell" if fell else
           f"slots handed over: {conversations} conversations through {slots} slots" if handovers else
           "not observed" if known or evictions is not None else
           "unknown: the server reports neither evictions nor cached tokens")
    return Recycling(observed=bool(evictions) or fell > 0 or handovers > 0, how=how,
                     evictions=evictions, requests_with_recycled_prefix=fell,
                     slot_handovers=handovers)
