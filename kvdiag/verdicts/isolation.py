"""The judge of the tenant-isolation audit: leaks the tenants measured (cached tokens and
TTFT of correct against wrong guesses), and wrong reads a sentinel inside the server saw."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdiag.verdicts.core import Judgement, Verdict
from kvdiag.verdicts.sentinel import sentinel_blind, sentinel_covered, sentinel_finding

if TYPE_CHECKING:
    from kvdiag.record.isolation_rows import IsolationCell, IsolationPlanBlock


ISOLATION_JUDGED = ("per-tenant", "adapter")  # the configurations whose leaks fail the audit


def classify_leaks(cells: list[IsolationCell], alpha: float, min_auc: float) -> list[IsolationCell]:
    """The isolation cells (kvdiag.runners.live.isolation_cells.analyse: cached-token and TTFT
    statistics of correct and wrong guesses), each copied with its flags set (the statistics
    are left as measured):
        hit           most correct guesses reused at least one block more than any wrong one
                      (the positive control's test)
        content_leak  any correct guess got more cached tokens than every wrong one did,
                      counting only those beyond the prefix it shares with the attacker's own
                      earlier prompts (an engine caching by the token hits a first token two
                      random guesses share; older summaries, without those counts: all)
        timing_leak   TTFT told them apart: p below alpha over the configuration's number of
                      lengths (Bonferroni) and max(AUC, 1 - AUC) >= min_auc
        leaks         either"""
    out = []
    for c in cells:
        bonferroni = alpha / sum(1 for d in cells if d.config == c.config)
        if c.beyond_own_correct_max is None or c.beyond_own_wrong_max is None:
            content = c.cached_correct_max > c.cached_wrong_max
        else:
            content = c.beyond_own_correct_max > c.beyond_own_wrong_max
        timing = c.p_value < bonferroni and max(c.auc, 1 - c.auc) >= min_auc
        out.append(c.model_copy(update={
            "hit": c.cached_correct_median >= c.cached_wrong_max + c.block_size,
            "content_leak": content, "timing_leak": timing, "leaks": content or timing}))
    return out


@dataclass(frozen=True)
class IsolationDetails:
    """What judge_isolation decided besides the verdict: every cell judged, its flags set
    (classify_leaks), and the judged configurations' leaking ones."""

    cells: list[IsolationCell] = field(default_factory=list)
    leaks: list[IsolationCell] = field(default_factory=list)


def judge_isolation(cells: list[IsolationCell], plan: IsolationPlanBlock, error: str | None,
                    sentinel=None) -> Judgement:
    """The tenant-isolation audit over its measured cells, classified here (classify_leaks
    under the plan's alpha and min_auc): fail if a judged configuration leaks at any length,
    or if a sentinel inside the server (kvdiag.record.sentinel.SentinelBlock, where one
    watched) saw a read of K/V another prefix, salt or adapter wrote; inconclusive if the
    positive control missed at any of the plan's lengths, the run stopped early, or the
    sentinel checked no read; else pass, naming what the sentinel checked. details:
    IsolationDetails."""
    judged = classify_leaks(cells, plan.alpha, plan.min_auc)
    lengths = plan.lengths
    leaks = [c for c in judged if c.config in ISOLATION_JUDGED and c.leaks]
    details = IsolationDetails(cells=judged, leaks=leaks)
    inside = sentinel_finding(sentinel)
    if leaks:
        worst = max(leaks, key=lambda c: (c.content_leak, c.length))
        return Judgement(Verdict.FAIL, f"{worst.config} leaks at a {worst.length}-token "
                         f"prefix: AUC {worst.auc:.2f} (p={worst.p_value:.2g}), cached tokens "
                         f"correct {worst.cached_correct_mean:.0f} vs wrong "
                         f"{worst.cached_wrong_mean:.0f}" + (f"; {inside}" if inside else ""), details)
    if inside is not None:
        return Judgement(Verdict.FAIL, inside, details)
    if error:
        return Judgement(Verdict.INCONCLUSIVE, error, details)
    hits = {c.length for c in judged if c.config == "same-salt" and c.hit}
    missed = [n for n in lengths if n not in hits]
    if missed:
        return Judgement(Verdict.INCONCLUSIVE, "the positive control (same salt for both tenants) did "
                         f"not hit at {', '.join(map(str, missed))} tokens: prefix caching is off, "
                         "the server drops cache_salt, or evicts between requests", details)
    if (blind := sentinel_blind(sentinel)) is not None:
        return Judgement(Verdict.INCONCLUSIVE, blind, details)
    return Judgement(Verdict.PASS, "isolated: the positive control hit at every length "
                     f"({', '.join(map(str, lengths))} tokens) and across salts cached tokens and "
                     "TTFT were indistinguishable" + sentinel_covered(sentinel), details)
