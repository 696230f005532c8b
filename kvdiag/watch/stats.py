"""A watch's figures per window of time, overall and per namespace: what was relayed, what the
over-hit oracle judged, what the sampled twins found, and two rates with 95 % intervals.

    divergence rate   departed twins / twins that hit the cache        (Wilson interval)
    SQDR              (pass@round_1 - pass@round_n) / n over the twins' conversation rounds
                      (kvdiag.metrics.decay.sqdr), pass = the twin did not depart; its
                      interval by the normal approximation of the two end rounds' rates
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from kvdiag.metrics.decay import sqdr

Z = 1.96


def wilson(k: int, n: int) -> tuple[float, float, float]:
    """k of n: the rate and its 95 % Wilson interval; NaNs for n = 0."""
    if n == 0:
        return math.nan, math.nan, math.nan
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def namespace_label(namespace: tuple) -> str:
    """A namespace as a page may show it: the model, and a short hash of the salt and
    adapter (a salt can name a tenant: it is never written)."""
    model, *rest = namespace
    tail = "" if not any(rest) else "#" + hashlib.sha256(repr(rest).encode()).hexdigest()[:8]
    return f"{model}{tail}"


@dataclass
class Tally:
    """Counts of one window (or one namespace in it)."""

    requests: int = 0  # generation requests relayed to the end
    judged: int = 0  # held against the bound
    over_hits: int = 0
    warmups: int = 0
    unjudged: int = 0  # the proxy forgot what could explain the count, or its ids were not known
    unreported: int = 0  # the upstream reported no cached count (or a streaming client asked for no usage)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    twins: int = 0  # sampled pairs judged
    reached: int = 0  # of them, the shared replay hit the cache
    departures: int = 0
    numerics: int = 0
    contaminated: int = 0  # isolated twins that reported cached tokens (no ground truth)
    by_round: Counter = field(default_factory=Counter)  # round -> twins reached
    departed_by_round: Counter = field(default_factory=Counter)

    def rates(self) -> dict:
        p, lo, hi = wilson(self.departures, self.reached)
        rounds = sorted(self.by_round)
        passes = {r: 1 - self.departed_by_round[r] / self.by_round[r] for r in rounds}
        value = half = math.nan
        if len(rounds) >= 2:
            r1, rn = rounds[0], rounds[-1]
            p1, pn = passes[r1], passes[rn]
            value = sqdr(passes)
            half = Z * math.sqrt(p1 * (1 - p1) / self.by_round[r1] + pn * (1 - pn) / self.by_round[rn]) / rn
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan
        return {"divergence_rate": p, "divergence_low": lo, "divergence_high": hi,
                "sqdr": value, "sqdr_low": value - half, "sqdr_high": value + half,
                "hit_rate": hit}

    def record(self) -> dict:
        out = asdict(self)
        out["by_round"] = {str(k): v for k, v in sorted(self.by_round.items())}
        out["departed_by_round"] = {str(k): v for k, v in sorted(self.departed_by_round.items())}
        return out | {k: (None if isinstance(v, float) and math.isnan(v) else v)
                      for k, v in self.rates().items()}


class Windows:
    """The current window's tallies; `roll` closes it (every `seconds`)."""

    def __init__(self, seconds: float, started: float) -> None:
        self.seconds, self.start = seconds, started
        self.total, self.spaces = Tally(), {}

    def tally(self, namespace: tuple) -> tuple[Tally, Tally]:
        return self.total, self.spaces.setdefault(namespace_label(namespace), Tally())

    def due(self, now: float) -> bool:
        return now - self.start >= self.seconds

    def roll(self, now: float) -> dict:
        """The closed window's record; a fresh window starts at `now`."""
        out = {"type": "window", "start": self.start, "end": now, "all": self.total.record(),
               "namespaces": {k: v.record() for k, v in sorted(self.spaces.items())}}
        self.start, self.total, self.spaces = now, Tally(), {}
        return out
