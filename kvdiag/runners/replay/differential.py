"""The live probe's differential phase (kvdiag.runners.live.differential) replayed through
vLLM's own KVCacheManager after a trace, each request's cached tokens held against the
over-hit oracle's bound (kvdiag.runners.live.oracle): the key-coverage family, model-free.

The phase's requests are cut from the trace's longest prompt at the trace's block size and
sent one at a time (each a session of one round, driven to its end before the next is
added), under a cache_salt of their own, so nothing the trace or the epilogue cached is a
legitimate hit. A request that reports more cached tokens than any earlier request of its
namespace (salt, adapter) could have cached for it was served a block whose key covers less
than its K/V depends on:

    request      ids (block 1 differs at slot o)        vLLM counts    bound
    base         [a0 .. a15][a16 .. a31][a32 ..] tail         0            0
    slot o       [a0 .. a15][a16 .. x .. a31][a32 ..]        16           16  healthy
                                                             64           16  slot o left out

The count is vLLM's own: PrefixCacheStats at admission, which the replay checks against what
get_computed_blocks returned (a mismatch is an invariant violation). Times are the order
of sending: request i is sent at 2i and done at 2i + 1; a reset before it happens at 2i.
"""

from __future__ import annotations

from kvdiag.runners.replay.drive import drive, trace_index
from kvdiag.runners.replay.trace import Trace, TraceRequest, is_twin

SALT = "kvdiag-differential"  # the phase's own namespace (live: a fresh salt per run)


def material_for(trace: Trace) -> list[int]:
    """The trace's longest prompt (twins aside): the token ids the phase's requests are cut from."""
    prompts = [r.prompt_ids for r in trace.requests if not is_twin(r.session)]
    return list(max(prompts, key=len, default=[]))


def needed(block: int) -> int:
    """Prompt tokens the phase needs: the base request and another as long (differential.pairs)."""
    from kvdiag.runners.live.differential import BLOCKS

    return 2 * (BLOCKS * block + block // 2)


def run_differential(engine, trace: Trace, adapter: str | None = None) -> dict:
    """The phase on `engine` (a VllmReplay whose trace has finished). Returns {"requests",
    "unit", "rows": [{"name", "family", "cached", "bound"}], "foreign_slots",
    "unwritten_slots", "skipped": why the phase could not run, or None}: the rows measured;
    which over-hit is the judge's to say (kvdiag.verdicts.differential_over_hits)."""
    from kvdiag.runners.live.differential import pairs
    from kvdiag.runners.live.oracle import HitRule, Sent, bounds

    block = trace.config.block_size
    material = material_for(trace)
    out = {"requests": 0, "unit": block, "rows": [], "foreign_slots": 0, "unwritten_slots": 0,
           "skipped": None}
    if len(material) < needed(block):
        out["skipped"] = (f"the trace's longest prompt has {len(material)} tokens; the phase "
                          f"needs {needed(block)}")
        return out
    sent: list[Sent] = []
    resets: list[int] = []
    names: dict[int, tuple[str, str]] = {}
    for i, pair in enumerate(pairs(material, block, adapter)):
        if pair.reset:
            if not engine.reset_prefix_cache():
                continue  # as the live phase: a cache that cannot reset skips the pair
            resets.append(2 * i)
        salt = pair.salt or SALT
        request = TraceRequest(session=f"d{i}~differential", round=1, prompt_ids=list(pair.ids),
                               output_ids=[pair.ids[0]], cache_salt=salt, lora=pair.model)
        phase = Trace(trace.config, [request])
        engine.index = trace_index(phase)
        (turn,) = drive(phase, engine)[request.session]
        stats = turn.stats
        out["foreign_slots"] += stats.foreign_slots
        out["unwritten_slots"] += stats.unwritten_slots
        names[i] = (pair.name, pair.family)
        sent.append(Sent(i, (salt, pair.model), pair.ids, 2 * i, 2 * i + 1, stats.cached_tokens,
                         out=len(request.output_ids)))
    found = bounds(sent, HitRule(block, True), resets)
    rows = [{"name": names[s.key][0], "family": names[s.key][1], "cached": s.cached,
             "bound": found[s.key]} for s in sent]
    out.update(requests=len(rows), rows=rows)
    return out
