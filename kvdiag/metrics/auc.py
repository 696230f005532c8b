"""ROC AUC of a timing side channel, with the Mann-Whitney U rank test.

The attacker's question is "was this guess cached?", answered from one number per request
(time to first token). The ROC AUC of that number for correct vs wrong guesses is the
probability that a random correct guess is faster than a random wrong one (ties count
half): 0.5 means the attacker learns nothing, 1.0 (or 0.0) means every guess is told apart.

The AUC is exactly the Mann-Whitney statistic scaled: AUC = U / (n1 * n2), with U counting
the (correct, wrong) pairs where the correct guess is faster. So the test of "AUC differs
from 0.5" is the U test, chosen because:
- it is distribution-free: TTFT on a shared machine is skewed and heavy-tailed (a request
  that waits behind another one takes several times longer), so no normal-theory test fits;
- it is exact for small samples: with 8 + 8 probes the exact null distribution of U (by
  counting, below) gives p-values down to 2 / C(16, 8) = 1.6e-4, no asymptotics needed;
- ties are handled: tied times count half in U (as in the AUC) and the p-value then uses the
  normal approximation with the tie-corrected variance (timer resolution, rounded times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

EXACT_MAX_PAIRS = 10_000  # n1 * n2 up to which the exact null distribution is counted


class RankTest(NamedTuple):
    auc: float  # P(correct faster than wrong) + P(tie) / 2, in [0, 1]
    u: float  # Mann-Whitney U of `faster` vs `slower`: pairs where faster < slower, ties 1/2
    p_value: float  # two-sided, against "both samples come from one distribution"
    exact: bool  # True: exact null distribution; False: normal approximation (ties or large)


def mann_whitney_u(faster: Sequence[float], slower: Sequence[float]) -> float:
    """U = #pairs (a, b) with a < b, plus half the tied pairs (a from `faster`, b from
    `slower`). O(n log n) by ranks; equals the pair count exactly."""
    ranks = _midranks([*faster, *slower])
    n1 = len(faster)
    r1 = sum(ranks[:n1])
    # Rank sum of `faster` counts pairs where it is LARGER; U for "smaller" is the complement.
    return n1 * len(slower) - (r1 - n1 * (n1 + 1) / 2)


def roc_auc(faster: Sequence[float], slower: Sequence[float]) -> float:
    """AUC = U / (n1 * n2): the probability that a draw from `faster` is below a draw from
    `slower` (ties half). ValueError on an empty sample."""
    if not faster or not slower:
        raise ValueError("roc_auc needs at least one value in each sample")
    return mann_whitney_u(faster, slower) / (len(faster) * len(slower))


def rank_test(faster: Sequence[float], slower: Sequence[float]) -> RankTest:
    """The AUC and the two-sided Mann-Whitney p-value (exact without ties for n1*n2 up to
    EXACT_MAX_PAIRS, else normal approximation with tie and continuity corrections)."""
    n1, n2 = len(faster), len(slower)
    auc = roc_auc(faster, slower)
    u = auc * n1 * n2
    values = [*faster, *slower]
    ties = len(set(values)) < len(values)
    if not ties and n1 * n2 <= EXACT_MAX_PAIRS:
        return RankTest(auc, u, _exact_p(u, n1, n2), True)
    return RankTest(auc, u, _normal_p(u, n1, n2, values), False)


def bootstrap_ci(faster: Sequence[float], slower: Sequence[float], *, level: float = 0.95,
                 resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUC, resampling each sample with replacement
    (stratified: n1 and n2 stay fixed). With 8 + 8 probes it is wide: it says how small a
    timing difference a "no leak" finding can still hide."""
    import random

    rng = random.Random(seed)
    aucs = sorted(roc_auc(rng.choices(faster, k=len(faster)), rng.choices(slower, k=len(slower)))
                  for _ in range(resamples))
    tail = (1 - level) / 2
    return aucs[int(tail * (resamples - 1))], aucs[int(round((1 - tail) * (resamples - 1)))]


def _midranks(values: list[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _u_counts(n1: int, n2: int) -> list[int]:
    """counts[u] = number of orderings of n1 + n2 distinct values whose U equals u.

    The classic recursion f(n1, n2, u) = f(n1 - 1, n2, u - n2) + f(n1, n2 - 1, u) (the
    largest value belongs to sample 1, adding n2 pairs, or to sample 2), tabulated over n2.
    """
    # row[m][u]: counts for (i, m) at the current i; start from i = 0 (one ordering, U = 0).
    row = [[1] for _ in range(n2 + 1)]
    for i in range(1, n1 + 1):
        new = [[1]]  # (i, 0): U = 0
        for m in range(1, n2 + 1):
            size = i * m + 1
            counts = [0] * size
            for u, c in enumerate(row[m]):  # largest from sample 1: (i - 1, m), U + m
                counts[u + m] += c
            for u, c in enumerate(new[m - 1]):  # largest from sample 2: (i, m - 1), same U
                counts[u] += c
            new.append(counts)
        row = new
    return row[n2]


def _exact_p(u: float, n1: int, n2: int) -> float:
    counts = _u_counts(n1, n2)
    total = math.comb(n1 + n2, n1)
    mean = n1 * n2 / 2
    # Two-sided: the probability of a U at least as far from the mean as the one observed.
    dist = abs(u - mean)
    tail = sum(c for k, c in enumerate(counts) if abs(k - mean) >= dist - 1e-9)
    return min(1.0, tail / total)


def _normal_p(u: float, n1: int, n2: int, values: list[float]) -> float:
    n = n1 + n2
    tie_term = 0.0
    for v in set(values):
        t = values.count(v)
        tie_term += t ** 3 - t
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0  # every value tied: nothing tells the samples apart
    z = max(0.0, abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(z / math.sqrt(2)))
