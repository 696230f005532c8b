"""The judge of the model-free audit: vLLM's allocator replayed (foreign reads, invariants,
hits across salts, the epilogue's findings). Tenant isolation's is isolation.py."""

from __future__ import annotations

from kvdiag.verdicts.core import Judgement, Verdict


def judge_audit(*, corrupted_rounds: list[int], invariant_violations: int, cross_tenant_hits: int,
                recycled_blocks: int, epilogue: list[str] = ()) -> Judgement:
    """vLLM's allocator replayed model-free: any foreign or unwritten read, broken invariant,
    hit across cache_salts, or wrong hit after the trace (`epilogue`: after a reset, across
    salts, across adapters) fails; a replay that recycled no cached block is inconclusive
    (the trigger was not reached)."""
    if corrupted_rounds or invariant_violations or cross_tenant_hits or epilogue:
        parts = []
        if corrupted_rounds:
            parts.append(f"foreign or unwritten slots read in rounds {corrupted_rounds}")
        if invariant_violations:
            parts.append(f"{invariant_violations} invariant violation(s)")
        if cross_tenant_hits:
            parts.append(f"{cross_tenant_hits} cache hit(s) on blocks another cache_salt wrote")
        parts += list(epilogue)
        return Judgement(Verdict.FAIL, "vLLM's allocator: " + "; ".join(parts))
    if not recycled_blocks:
        return Judgement(Verdict.INCONCLUSIVE, "the trigger was not reached: the replay recycled no "
                         "cached block, so a clean replay proves nothing")
    return Judgement(Verdict.PASS, f"no foreign slot read and every invariant held, with "
                     f"{recycled_blocks} cached blocks recycled")
