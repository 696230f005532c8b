"""The rule of one regression check: a metric against its baseline under a tolerance, in the
direction that makes it worse (kvdiag.regress.compare states the tolerances and calls it).

    direction +1   higher is worse: passes while value <= baseline + tol
    direction -1   lower is worse:  passes while value >= baseline - tol

The limit is the worst value still passing; a value exactly at it passes (within EPS, so a
rate recomputed from the same counts never fails on rounding).
"""

from __future__ import annotations

EPS = 1e-12


def within_tolerance(value: float, baseline: float, direction: int, tol: float) -> tuple[float, bool]:
    """(limit, passed): the worst value still passing (baseline + direction * tol) and whether
    `value` is within it. `direction` is +1 (higher is worse) or -1 (lower is worse)."""
    if direction not in (1, -1):
        raise ValueError(f"direction {direction!r}: expected +1 (higher is worse) or -1 (lower is worse)")
    limit = baseline + direction * tol
    passed = value <= limit + EPS if direction > 0 else value >= limit - EPS
    return limit, passed
