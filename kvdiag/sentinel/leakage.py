"""Attention leakage per request, from a sentinel inside a live engine: the reference engine's
`attention_leakage` (the mean over a request's sampled tokens of the attention, averaged over
layers and heads, that the token paid to slots read wrong), where the engine hands the
sentinel each sampled token's attention over its context (engines/vllm/attention.py,
engines/sglang/attention.py).

    leak = Leakage(log.leakage)
    leak.token(rid, bad, weights)   # every sampled token: the positions it read wrong this
                                    # step (the ledger's bad_now; None: none), its attention
    leak.finish(rid)                # a request that leaked, or could not be measured, finished

A request that leaked has its totals handed to `write` after each of its tokens (final=False:
the log keeps the latest and writes it with its counters, so one still running when the file
is read is there too) and once more when it finishes (final=True).

A token that read nothing wrong leaked exactly 0, weighed or not; one that read a wrong slot
with no attention to weigh it by is counted in its line's `unmeasured`, and then the probe
calls the whole run's leakage unmeasured (NaN in every round, never partly 0:
runners/live/sentinel.py). Only requests that read something wrong get a line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ENV = "KVDIAG_SENTINEL_ATTENTION"  # 1: a sentinel also weighs attention (off otherwise: it costs)


def asked() -> bool:
    """Whether the sentinel's engines should weigh attention ($KVDIAG_SENTINEL_ATTENTION=1).
    Off by default: on a CPU it recomputes a row of attention per request, layer and step: a
    quarter of vLLM's wall time in benchmarks/sentinel_overhead.py (2 cores, canary, as the
    worker counts it), above the sentinel's 1.15 target."""
    import os

    return os.environ.get(ENV, "").strip() == "1"


class Leakage:
    def __init__(self, write: Callable[..., None]) -> None:
        self.write = write
        self.acc: dict[str, list] = {}  # rid -> [tokens sampled, leaked mass, tokens unmeasured]

    def token(self, rid: str, bad: np.ndarray | None, weights: np.ndarray | None) -> None:
        acc = self.acc.setdefault(rid, [0, 0.0, 0])
        acc[0] += 1
        if bad is not None and len(bad):
            if weights is None or len(weights) <= int(bad.max()):
                acc[2] += 1
            else:
                acc[1] += float(weights[bad].sum())
        self._report(rid, acc, final=False)

    def finish(self, rid: str) -> None:
        acc = self.acc.pop(rid, None)
        if acc is not None:
            self._report(rid, acc, final=True)

    def _report(self, rid: str, acc: list, final: bool) -> None:
        if acc[1] > 0 or acc[2]:
            self.write(rid, *acc, final=final)
