"""The tenant-isolation audit's requests summed into cells, one per (configuration, prefix
length): cached tokens of correct and wrong guesses, TTFT medians, the rank test's AUC and p.
Statistics only: whether a cell leaks is kvdiag.verdicts.classify_leaks' to say, at judge time."""

from __future__ import annotations

import statistics

from kvdiag.metrics.auc import bootstrap_ci, rank_test
from kvdiag.record.isolation_rows import IsolationCell


def analyse(rows: list[dict], block_size: int) -> list[IsolationCell]:
    """One cell per (configuration, length) of measured trials (warm-up excluded), unjudged."""
    out = []
    keys = dict.fromkeys((r["config"], r["length"]) for r in rows if r["trial"] >= 0)
    for config, length in keys:
        sel = [r for r in rows if (r["config"], r["length"]) == (config, length) and r["trial"] >= 0]
        right = [r for r in sel if r["role"] == "correct"]
        wrong = [r for r in sel if r["role"] == "wrong"]
        if not right or not wrong:
            continue
        cached_r, cached_w = [r["cached_tokens"] for r in right], [r["cached_tokens"] for r in wrong]
        beyond_r, beyond_w = ([max(0, r["cached_tokens"] - r.get("own_prefix", 0)) for r in rs]
                              for rs in (right, wrong))
        ttft_r, ttft_w = [r["ttft_s"] for r in right], [r["ttft_s"] for r in wrong]
        test = rank_test(ttft_r, ttft_w)
        out.append(IsolationCell(
            config=config, length=length, trials=min(len(right), len(wrong)),
            cached_correct_mean=statistics.fmean(cached_r), cached_wrong_mean=statistics.fmean(cached_w),
            cached_correct_max=max(cached_r), cached_wrong_max=max(cached_w),
            cached_correct_median=statistics.median(cached_r), block_size=block_size,
            beyond_own_correct_max=max(beyond_r), beyond_own_wrong_max=max(beyond_w),
            ttft_correct_median_s=statistics.median(ttft_r),
            ttft_wrong_median_s=statistics.median(ttft_w),
            auc=test.auc, auc_ci95=list(bootstrap_ci(ttft_r, ttft_w)),
            p_value=test.p_value, exact_p=test.exact))
    return out
