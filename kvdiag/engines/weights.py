"""Each sampled token's attention over its context, as the engines' leakage hooks measure it
(engines/vllm/attention.py, engines/sglang/attention.py), a whole layer's rows at once, and
held against the engine's own attention output: the weights must give back, with the
engine's V, what its kernel wrote for that token. Until CHECKS rows agree a weigher keeps
checking; the first that does not turns it off for the process (K or V read from the wrong
place, a mask it does not know), so leakage is then unmeasured, never computed on a misread
cache.

    weigh = Weigher("vllm")
    with weigh.timed():                                       # weigh.seconds: its cost
        values = [V of row i for i in range(weigh.left(rows))]   # [kv_heads, length, dim] each
        w = weigh(q, k, lengths, scale, out, values)
        # q, out [rows, heads, dim]: each row's sampling token; k [rows, kv_heads, context, dim]
        # (padded past each row's length) -> the mean over heads of the softmax weights
        # [rows, context] (0 past each length), or None
"""

from __future__ import annotations

import contextlib
import logging
import time

CHECKS = 64  # rows per process whose output is recomputed from the weights and compared
TOLERANCE = 0.05  # the largest difference, relative to the output's largest magnitude (bf16 kernels)
ELEMENTS = 1 << 23  # K elements one call gathers at most (32 MB in float32); rows in groups

log = logging.getLogger("kvdiag.attention")


def groups(lengths: list[int], width: int) -> list[range]:
    """Consecutive rows in groups whose padded K ([rows, longest, width]) stays under ELEMENTS."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest = max(longest, n)
        if i > start and (i + 1 - start) * longest * width > ELEMENTS:
            out.append(range(start, i))
            start, longest = i, n
    if start < len(lengths):
        out.append(range(start, len(lengths)))
    return out


class Weigher:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.checked = 0
        self.off: str | None = None  # why it stopped weighing
        self.seconds = 0.0  # spent weighing in this process (timed())

    @contextlib.contextmanager
    def timed(self):
        """Count the time of a layer's weighing (the gathers around the weigher's call too)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0

    def stop(self, why: str) -> None:
        """Weigh nothing more in this process, and say why in the engine's log."""
        if not self.off:
            self.off = why
            log.warning("kvdiag: attention leakage off in this process: %s", why)

    def left(self, rows: int) -> int:
        """How many of the next `rows` rows are still held against the kernel: the first ones,
        whose V the caller gathers (only those)."""
        return 0 if self.off else max(0, min(rows, CHECKS - self.checked))

    def __call__(self, q, k, lengths, scale: float, out, values):
        import torch

        if self.off:
            return None
        rows, kv_heads, context, dim = k.shape
        heads = q.shape[1]
        scores = torch.matmul(q.reshape(rows, kv_heads, heads // kv_heads, dim).float(),
                              k.float().transpose(-1, -2)) * scale
        lengths_t = torch.as_tensor(lengths).reshape(rows, 1, 1, 1)
        scores.masked_fill_(torch.arange(context) >= lengths_t, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        for i, v in enumerate(values):
            mine = torch.einsum("kgl,kld->kgd", p[i, :, :, :lengths[i]], v.float()).reshape(heads, -1)
            theirs = out[i].reshape(heads, -1).float()
            err = float((mine - theirs).abs().max() / theirs.abs().max().clamp_min(1e-6))
            if not err <= TOLERANCE:  # NaN included
                self.stop(f"the weights give back {self.engine}'s attention output to within "
                          f"{err:.3g} of its magnitude (tolerance {TOLERANCE}) after "
                          f"{self.checked} rows agreed")
                return None
            self.checked += 1
        return p.mean((1, 2))
