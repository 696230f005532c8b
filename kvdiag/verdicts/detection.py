"""Which channel caught a planted fault, for the detection matrix's "caught by" column
(kvdiag detect): named from what the run counted, each channel whose count is not zero,
joined by commas, or "-" when none did. A label read like a verdict, so decided here.

    live probe      sentinel, over-hit, answer, logprobs, top-k, ground truth
    isolation       isolation (a leak the tenants measured), sentinel
    model-free      read, invariant, salt, over-hit, epilogue
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvdiag.verdicts.core import Verdict

if TYPE_CHECKING:
    from kvdiag.record.audit_section import AuditSection
    from kvdiag.record.evidence import GroundTruth, Oracle, PromptLogprobs, TopK
    from kvdiag.record.sentinel import SentinelBlock

NONE = "-"  # no channel caught anything


def _named(found: list[tuple[str, object]]) -> str:
    return ",".join(what for what, n in found if n) or NONE


def probe_caught_by(*, sentinel: SentinelBlock | None, oracle: Oracle, corrupted_requests: int,
                    prompt_logprobs: PromptLogprobs, topk: TopK, ground_truth: GroundTruth) -> str:
    """How a live probe caught its fault, from the blocks its judge counted: the sentinel
    inside the server (bad reads), over-hits (the oracle), answers that diverged, prompt
    logprobs, top-k logprobs, ground truth (isolated requests hit the cache)."""
    return _named([("sentinel", sentinel.bad if sentinel else 0), ("over-hit", oracle.over_hits),
                   ("answer", corrupted_requests), ("logprobs", prompt_logprobs.mismatched),
                   ("top-k", topk.departed), ("ground truth", ground_truth.contaminated)])


def isolation_caught_by(verdict: Verdict, leaks: int, sentinel: SentinelBlock | None) -> str:
    """How the tenant-isolation audit caught its fault when it failed: a leak its tenants
    measured (`leaks`: the judged configurations' leaking cells), bad reads the sentinel
    inside the server saw, or both."""
    if verdict is not Verdict.FAIL:
        return NONE
    return _named([("isolation", leaks), ("sentinel", sentinel.bad if sentinel else 0)])


def audit_caught_by(section: AuditSection) -> str:
    """How the model-free audit caught its fault, from its section of summary.json
    ("vllm_audit", as kvdiag.runners.replay.audit writes it): a corrupted read, an invariant,
    a hit across salts, the differential phase's over-hits, the epilogue's other findings
    (the differential adds one finding of its own when it over-hit)."""
    epilogue = section.epilogue
    over = (epilogue.differential.over_hits or 0) if epilogue is not None else 0
    findings = epilogue.findings if epilogue is not None else []
    return _named([("read", section.corrupted_rounds),
                   ("invariant", section.invariant_violations),
                   ("salt", section.cross_tenant_hits), ("over-hit", over),
                   ("epilogue", len(findings) > (1 if over else 0))])
