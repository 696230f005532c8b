"""The isolation audit's leak label is decided at judge time only: judge_isolation flags the
cells from their statistics (the runner's cells carry none), leaves the measured cells as
they were, applies the plan's alpha (Bonferroni over a configuration's lengths) and min_auc;
and the runner's modules import nothing from kvdiag.verdicts."""

from __future__ import annotations

import ast
from pathlib import Path

from kvdiag.record.isolation_rows import IsolationCell, IsolationPlanBlock
from kvdiag.record.sentinel import SentinelBlock, SentinelFinding
from kvdiag.verdicts import Verdict, judge_isolation

ROOT = Path(__file__).resolve().parents[3]


def _stats(config: str, length: int, cached: int, auc: float = 0.5, p: float = 1.0) -> IsolationCell:
    """A cell as kvdiag.runners.live.isolation_cells.analyse builds it: statistics, no flags."""
    return IsolationCell(config=config, length=length, trials=8, cached_correct_mean=cached,
                         cached_wrong_mean=0, cached_correct_max=cached, cached_wrong_max=0,
                         cached_correct_median=cached, block_size=16, ttft_correct_median_s=0.02,
                         ttft_wrong_median_s=0.02, auc=auc, auc_ci95=[0.3, 0.7], p_value=p,
                         exact_p=True)


def test_the_judge_flags_a_leaking_cell_and_not_a_clean_one_from_statistics_alone():
    cells = [_stats("same-salt", 64, 64), _stats("per-tenant", 64, 0),
             _stats("per-tenant", 128, 32)]  # one block of a 128-token secret came back
    assert all(c.leaks is None and c.hit is None for c in cells)
    judged = judge_isolation(cells, IsolationPlanBlock(lengths=[64]), None)
    assert judged.verdict is Verdict.FAIL and "128-token" in judged.reason
    flags = {(c.config, c.length): (c.content_leak, c.timing_leak, c.leaks)
             for c in judged.details.cells}
    assert flags == {("same-salt", 64): (True, False, True), ("per-tenant", 64): (False, False, False),
                     ("per-tenant", 128): (True, False, True)}
    assert [(c.config, c.length) for c in judged.details.leaks] == [("per-tenant", 128)]
    assert all(c.leaks is None for c in cells)  # the measured statistics are left as measured


def test_timing_alone_leaks_only_past_the_bonferroni_alpha_and_min_auc():
    def verdict(p: float, auc: float, alpha: float = 0.01) -> Verdict:
        cells = [_stats("same-salt", n, n) for n in (16, 64)]
        cells += [_stats("per-tenant", 16, 0), _stats("per-tenant", 64, 0, auc, p)]
        plan = IsolationPlanBlock(lengths=[16, 64], alpha=alpha, min_auc=0.75)
        return judge_isolation(cells, plan, None).verdict

    assert verdict(0.004, 0.9) is Verdict.FAIL  # under 0.01 / 2 lengths
    assert verdict(0.008, 0.9) is Verdict.PASS  # under alpha, not under alpha / 2
    assert verdict(0.008, 0.9, alpha=0.02) is Verdict.FAIL  # the plan's alpha is the one used
    assert verdict(0.004, 0.7) is Verdict.PASS  # significant but small: under min_auc
    assert verdict(0.004, 0.1) is Verdict.FAIL  # faster when wrong tells them apart too


def test_a_control_that_missed_is_inconclusive_whatever_the_other_cells_say():
    cells = [_stats("same-salt", 64, 0), _stats("per-tenant", 64, 0)]
    judged = judge_isolation(cells, IsolationPlanBlock(lengths=[64]), None)
    assert judged.verdict is Verdict.INCONCLUSIVE and "positive control" in judged.reason
    assert [c.hit for c in judged.details.cells] == [False, False]


def _sentinel(reads: int, foreign: int = 0) -> SentinelBlock:
    found = [SentinelFinding(kind="foreign", step=7, request="chatcmpl-1", positions=[[0, 16]],
                             count=foreign, context_len=64, writers=["chatcmpl-0"])] if foreign else []
    return SentinelBlock(source="sentinel.jsonl", starts=1, steps=9, requests=4, reads=reads,
                         writes=64, unchecked=0, foreign=foreign, unwritten=0, overwrite=0,
                         findings=found, findings_total=len(found))


def test_a_sentinel_inside_the_server_fails_what_the_tenants_could_not_measure():
    """A wrong read inside the server fails the audit even where no cell leaked; with a leak
    too, both are named; a sentinel that checked no read makes an otherwise clean audit
    inconclusive; a clean one is named in the PASS."""
    plan = IsolationPlanBlock(lengths=[64])
    clean = [_stats("same-salt", 64, 64), _stats("per-tenant", 64, 0)]
    judged = judge_isolation(clean, plan, None, _sentinel(500, foreign=16))
    assert judged.verdict is Verdict.FAIL and judged.reason.startswith("sentinel: 16 foreign")
    assert "chatcmpl-1 read positions 0-15 foreign" in judged.reason and not judged.details.leaks
    leaking = clean + [_stats("adapter", 64, 16)]
    both = judge_isolation(leaking, plan, None, _sentinel(500, foreign=16))
    assert both.verdict is Verdict.FAIL and both.reason.startswith("adapter leaks")
    assert "sentinel: 16 foreign" in both.reason
    blind = judge_isolation(clean, plan, None, _sentinel(0))
    assert blind.verdict is Verdict.INCONCLUSIVE and "checked no KV read" in blind.reason
    fine = judge_isolation(clean, plan, None, _sentinel(500))
    assert fine.verdict is Verdict.PASS and "500 KV slot reads checked, 0 foreign" in fine.reason
    assert "sentinel" not in judge_isolation(clean, plan, None).reason  # none watched


def test_the_runner_imports_nothing_from_the_verdicts():
    for name in ("isolation.py", "isolation_cells.py", "isolation_plan.py"):
        tree = ast.parse((ROOT / "kvdiag" / "runners" / "live" / name).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("kvdiag.verdicts")], name


def test_a_hit_the_attackers_own_history_explains_is_no_content_leak():
    """SGLang caches by the token: a guess whose first token an earlier guess of the same
    tenant shared gets 1 cached token, a correct guess as well as a wrong one. Only tokens
    beyond the attacker's own prefix count (a healthy SGLang once failed on 1 vs 0)."""
    def cell(correct, wrong, beyond_correct, beyond_wrong):
        return _stats("per-tenant", 256, 0).model_copy(update={
            "cached_correct_max": correct, "cached_wrong_max": wrong,
            "beyond_own_correct_max": beyond_correct, "beyond_own_wrong_max": beyond_wrong})
    plan = IsolationPlanBlock(lengths=[256])
    own = judge_isolation([cell(1, 0, 0, 0)], plan, None).details.cells[0]
    assert own.content_leak is False
    leaked = judge_isolation([cell(257, 1, 256, 0)], plan, None)
    assert leaked.verdict is Verdict.FAIL and leaked.details.cells[0].content_leak is True
    older = judge_isolation([cell(1, 0, None, None)], plan, None).details.cells[0]
    assert older.content_leak is True  # a summary without the counts: every cached token counts
