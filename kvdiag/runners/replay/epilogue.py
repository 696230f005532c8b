"""After a trace, on the same KVCacheManager: the checks that traffic of one tenant and one
model cannot make. Each phase sends the first BLOCKS blocks of every session's first prompt
again (one output token), one phase after the other, so each phase's blocks are still cached
when the later phases look them up:

    phase               sends                             a correct cache      catches
    after reset         reset_prefix_cache(), then base   misses everything    reset-noop
    salt a              cache_salt A                      misses               salt-ignored
    salt b              cache_salt B                      misses A's blocks    salt-ignored
    adapter             adapter X                         misses base blocks   lora-ignored
    salt = adapter X    base, cache_salt "X"              misses X's blocks    tags-dropped
    differential        the live probe's differential     no more than the     slot-omitted,
                        phase, one request at a time      oracle's bound       range-omitted,
                        (differential.py)                                      parent-ignored

A miss where a hit would be wrong is all a correct cache owes; a wrong hit shows as a read
of slots written before the reset or under other weights (the shadow map's namespaces), or
as a hit on blocks another cache_salt wrote (ShadowCache.cross_tenant), or, in the
differential phase, as more cached tokens than the over-hit oracle allows. No model, no
server: the adapter is a name, as vLLM's block hash sees it.
"""

from __future__ import annotations

import dataclasses

from kvdiag.runners.replay.differential import run_differential
from kvdiag.runners.replay.drive import drive, trace_index
from kvdiag.runners.replay.trace import Trace, is_twin

ADAPTER = "kvdiag-adapter"
BLOCKS = 12  # per request: small enough that the phases never evict one another
PHASES = (("after reset", None, None), ("salt a", "kvdiag-tenant-a", None),
          ("salt b", "kvdiag-tenant-b", None), ("adapter", None, ADAPTER),
          ("salt = adapter name", ADAPTER, None))


def run_epilogue(engine, trace: Trace) -> dict:
    """The phases on `engine` (a VllmReplay whose trace has finished). Returns {"reset": did
    vLLM say it reset, "phases": [{"phase", "requests", "hit_tokens", "foreign_slots",
    "unwritten_slots", "cross_tenant_hits"}], "differential": run_differential's rows,
    "findings": [one line per wrong hit of the phases; the differential's are added by
    kvdiag.commands.audit.judge]}."""
    firsts = [rounds[0] for session, rounds in trace.by_session().items() if not is_twin(session)]
    reset = engine.reset_prefix_cache()
    cap = BLOCKS * trace.config.block_size + 1
    out, findings = [], []
    for n, (name, salt, lora) in enumerate(PHASES):
        requests = [dataclasses.replace(r, session=f"e{n}~{r.session}", round=1,
                                        prompt_ids=r.prompt_ids[:cap], output_ids=r.output_ids[:1],
                                        think_steps=0, cache_salt=salt, lora=lora,
                                        prompt_logprobs=False)
                    for r in firsts]
        phase = Trace(trace.config, requests)
        engine.index = trace_index(phase)
        before = engine.cross_tenant_hits
        turns = drive(phase, engine)
        stats = [t.stats for rounds in turns.values() for t in rounds]
        row = {"phase": name, "requests": len(stats),
               "hit_tokens": sum(s.cached_tokens for s in stats),
               "foreign_slots": sum(s.foreign_slots for s in stats),
               "unwritten_slots": sum(s.unwritten_slots for s in stats),
               "cross_tenant_hits": engine.cross_tenant_hits - before}
        out.append(row)
        if row["foreign_slots"] or row["unwritten_slots"]:
            what = "written before the reset" if n == 0 else "written under other weights"
            findings.append(f"{name}: {row['foreign_slots'] + row['unwritten_slots']} slots read "
                            f"that were {what}")
        if row["cross_tenant_hits"]:
            findings.append(f"{name}: {row['cross_tenant_hits']} cache hits on blocks another "
                            "cache_salt wrote")
    if not reset:
        findings.append("after reset: vLLM refused to reset its prefix cache with nothing running")
    differential = run_differential(engine, trace, adapter=ADAPTER)  # judged in commands/audit.py
    return {"reset": reset, "phases": out, "differential": differential, "findings": findings}
