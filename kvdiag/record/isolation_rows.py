"""The tenant-isolation audit's evidence, typed: the cells its runner measured
(kvdiag.runners.live.isolation), the server facts and the plan it ran under, as
IsolationSummary stores them (`isolation`, `leaks`) and every reader (page, terminal,
history) reads them by attribute.

A cell holds statistics only (cached tokens, TTFT medians, the rank test's AUC and p) until
kvdiag.verdicts.classify_leaks judges it: its flags (`hit`, `content_leak`, `timing_leak`,
`leaks`) are None before, and the summary stores the judged cells. Every field has a default
and a key a block does not declare is ignored on load, so a summary written by an older
kvdiag (plain JSON with these keys) still loads.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from kvdiag.record.evidence import Block
from kvdiag.record.summary_rows import Num


class IsolationCell(Block):
    """One (configuration, prefix length) of the audit: the attacker's correct vs wrong
    guesses over the measured trials, and the judge's flags once judged."""

    config: str = Field("", description="no-salt, per-tenant, same-salt or adapter "
                        "(kvdiag.runners.live.isolation_plan.CONFIGS)")
    length: int = Field(0, description="the secret prefix's length, in tokens")
    trials: int = Field(0, description="measured pairs of guesses (warm-up excluded)")
    # cached prompt tokens per guess over the trials: means and maxima, the correct ones' median
    cached_correct_mean: Num = 0
    cached_wrong_mean: Num = 0
    cached_correct_max: Num = 0
    cached_wrong_max: Num = 0
    cached_correct_median: Num = 0
    # the most cached tokens a guess got beyond the longest prefix it shares with the
    # attacker's own earlier prompts (same salt, same model): what its own history cannot
    # explain. None in a summary older than these two fields (the judge then reads the maxima)
    beyond_own_correct_max: Num | None = None
    beyond_own_wrong_max: Num | None = None
    ttft_correct_median_s: float = 0.0
    ttft_wrong_median_s: float = 0.0
    block_size: int = Field(16, description="the server's block size the cell was measured with")
    auc: float = Field(0.5, description="P(a correct guess's TTFT < a wrong one's), ties as half")
    auc_ci95: list[float] = Field(default_factory=list, description="bootstrap 95 % interval "
                                  "of the AUC: [low, high]")
    p_value: float = Field(1.0, description="the rank test's two-sided p of the TTFT samples")
    exact_p: bool = Field(False, description="p from the full permutation distribution (else "
                          "the tie-corrected normal approximation)")
    hit: bool | None = Field(None, description="judged: most correct guesses reused at least "
                             "one block more than any wrong one (the positive control's test)")
    content_leak: bool | None = Field(None, description="judged: a correct guess got more "
                                      "cached tokens beyond its own history than every wrong one")
    timing_leak: bool | None = Field(None, description="judged: TTFT told the guesses apart "
                                     "(Bonferroni p under alpha, AUC past min_auc)")
    leaks: bool | None = Field(None, description="judged: content_leak or timing_leak")


class IsolationLeak(IsolationCell):
    """One entry of summary.json's `leaks`: a judged cell of a judged configuration
    (per-tenant, adapter) that leaks, as kvdiag.verdicts.judge_isolation names it."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)  # built from a judged cell


class IsolationServer(Block):
    """What the audit learnt of the server: its block size and where that came from, its
    context length, and where each request's cached tokens were read."""

    block_size: int | None = None
    block_size_source: str = Field("", description="vllm:cache_config_info, option (the user's "
                                   "--block-size) or assumed")
    max_model_len: int | None = Field(None, description="from /v1/models; None: not reported")
    cached_tokens_source: str = Field("", description="usage (the stream's "
                                      "prompt_tokens_details) or metrics (the hits counter's delta)")


class IsolationPlanBlock(Block):
    """The plan the audit ran (kvdiag.runners.live.isolation_plan.IsolationPlan, same
    defaults) with what it resolved: the prefix lengths, the seed and the configurations."""

    lengths: list[int] = Field(default_factory=list)
    trials: int = 8
    warmup: int = 2
    max_requests: int = 2000
    max_seconds: float = 900.0
    alpha: float = Field(0.01, description="family-wise per configuration, Bonferroni over "
                         "its lengths")
    min_auc: float = Field(0.75, description="a timing leak needs max(AUC, 1 - AUC) this high")
    seed: int | None = None
    adapter: str | None = Field(None, description="the adapter name a salt collides with "
                                "(the `adapter` configuration); None: not audited")
    suffix_tokens: int = 8
    configurations: list[str] = Field(default_factory=list)


class IsolationBlock(Block):
    """summary.json's `isolation`: the server facts, the plan, every judged cell, and whether
    the unsalted exposure (not judged) leaked."""

    server: IsolationServer = Field(default_factory=IsolationServer)
    plan: IsolationPlanBlock = Field(default_factory=IsolationPlanBlock)
    cells: list[IsolationCell] = Field(default_factory=list)
    exposure_leaks: bool = Field(False, description="a no-salt cell leaked (shared cache by "
                                 "design: not judged)")
