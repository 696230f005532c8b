"""One query token's attention over its context, as the engines' leakage hooks measure it
(engines/vllm/attention.py, engines/sglang/attention.py), held against the engine's own
attention output: the weights must give back, with the engine's V, what its kernel wrote for
that token. Until CHECKS rows agree a weigher keeps checking; the first that does not turns it
off for the process (K or V read from the wrong place, a mask it does not know), so leakage is
then unmeasured, never computed on a misread cache.

    weigh = Weigher("vllm")
    w = weigh(q, k, v, scale, out)   # q, out [heads, dim]; k, v [kv_heads, context, dim]
                                     # (v only while weigh.checking) -> the mean over heads of
                                     # the softmax weights [context], or None
"""

from __future__ import annotations

import logging

CHECKS = 64  # rows per process whose output is recomputed from the weights and compared
TOLERANCE = 0.05  # the largest difference, relative to the output's largest magnitude (bf16 kernels)

log = logging.getLogger("kvdiag.attention")


class Weigher:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.checked = 0
        self.off: str | None = None  # why it stopped weighing

    def stop(self, why: str) -> None:
        """Weigh nothing more in this process, and say why in the engine's log."""
        if not self.off:
            self.off = why
            log.warning("kvdiag: attention leakage off in this process: %s", why)

    @property
    def checking(self) -> bool:
        """Whether the next row is held against the kernel (its V is needed then, only)."""
        return self.checked < CHECKS

    def __call__(self, q, k, v, scale: float, out):
        import torch

        if self.off:
            return None
        kv_heads, (heads, dim) = k.shape[0], q.shape
        p = torch.softmax(torch.einsum("kgd,kld->kgl", q.reshape(kv_heads, heads // kv_heads, dim).float(),
                                       k.float()) * scale, dim=-1)
        if self.checking:
            mine = torch.einsum("kgl,kld->kgd", p, v.float()).reshape(heads, -1)
            theirs = out.reshape(heads, -1).float()
            err = float((mine - theirs).abs().max() / theirs.abs().max().clamp_min(1e-6))
            if not err <= TOLERANCE:  # NaN included
                self.stop(f"the weights give back {self.engine}'s attention output to within "
                          f"{err:.3g} of its magnitude (tolerance {TOLERANCE}) after "
                          f"{self.checked} rows agreed")
                return None
            self.checked += 1
        return p.mean((0, 1))
