"""What the tenant-isolation audit sends (kvdiag.runners.live.isolation): its configurations,
the prefix lengths, and the plan a command builds from its options (checked at once)."""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.errors import KvdiagError

CONFIGS = ("no-salt", "per-tenant", "same-salt")
LENGTH_BLOCKS = (1, 4, 16, 128)  # default prefix lengths, in blocks


@dataclass(frozen=True)
class IsolationPlan:
    """What to send. `lengths` None: LENGTH_BLOCKS x the server's block size, capped by its
    max_model_len. `seed` None: a fresh random seed (recorded), so reruns never meet secrets
    an earlier run left in the cache."""

    lengths: tuple[int, ...] | None = None
    trials: int = 8
    warmup: int = 2
    max_requests: int = 2000
    max_seconds: float = 900.0
    alpha: float = 0.01  # family-wise per configuration, Bonferroni over its lengths
    min_auc: float = 0.75  # timing leaks only if max(AUC, 1 - AUC) reaches this too
    seed: int | None = None
    adapter: str | None = None
    suffix_tokens: int = 8

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise KvdiagError(f"--trials must be at least 1 (got {self.trials})")
        if self.lengths is not None and (not self.lengths or min(self.lengths) < 1):
            raise KvdiagError("--lengths must be positive token counts")


def parse_lengths(text: str | None) -> tuple[int, ...] | None:
    """'16,64,2048' -> (16, 64, 2048); None or 'auto' -> None. ValueError names a bad item."""
    if text is None or text.strip().lower() == "auto":
        return None
    out = []
    for item in text.split(","):
        if not item.strip().isdigit():
            raise KvdiagError(f"--lengths: {item.strip()!r} is not a whole number of tokens")
        out.append(int(item))
    return tuple(sorted(set(out)))
