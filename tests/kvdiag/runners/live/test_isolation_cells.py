"""The isolation audit's runner keeps, for every request, the prefix it shares with what the
same tenant sent before under the same salt and model, and its cells keep the cached tokens
beyond it: statistics the judge reads (kvdiag.verdicts.classify_leaks)."""

from __future__ import annotations

from kvdiag.runners.live.isolation import _Prober
from kvdiag.runners.live.isolation_cells import analyse


def test_own_prefix_is_the_longest_shared_with_the_same_tenants_earlier_prompts():
    p = _Prober(None, None)
    assert p.own_prefix("attacker", "A", None, [5, 6, 7]) == 0
    assert p.own_prefix("attacker", "A", None, [5, 6, 9]) == 2
    assert p.own_prefix("attacker", "A", None, [5, 1]) == 1
    # another tenant, salt or model is another history, even over the same tokens
    assert p.own_prefix("victim", "A", None, [5, 6, 7]) == 0
    assert p.own_prefix("attacker", "B", None, [5, 6, 7]) == 0
    assert p.own_prefix("attacker", "A", "lora", [5, 6, 7]) == 0
    assert p.own_prefix("attacker", "A", None, [5, 6, 7, 8]) == 3


def test_a_cell_counts_cached_tokens_beyond_the_tenants_own_prefix():
    def row(role, trial, cached, own):
        return {"config": "per-tenant", "length": 64, "trial": trial, "role": role,
                "ttft_s": 0.01 + trial / 1000, "cached_tokens": cached, "own_prefix": own}
    rows = [row("correct", 0, 1, 1), row("wrong", 0, 0, 0), row("correct", 1, 0, 0),
            row("wrong", 1, 1, 1), row("plant", 1, 0, 0), row("correct", -1, 64, 0)]
    (cell,) = analyse(rows, 16)
    assert (cell.cached_correct_max, cell.cached_wrong_max) == (1, 1)
    assert (cell.beyond_own_correct_max, cell.beyond_own_wrong_max) == (0, 0)  # warm-up left out
    leaked = rows + [row("correct", 2, 64, 1), row("wrong", 2, 0, 0)]
    (cell,) = analyse(leaked, 16)
    assert (cell.beyond_own_correct_max, cell.beyond_own_wrong_max) == (63, 0)
