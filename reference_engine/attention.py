"""Attention over K/V already gathered for one sequence (prefill) or a padded batch (decode).

Two masking modes:
- "additive": masked scores are -inf before the softmax and masked slots are never read
  (padding points at the zero null block). Correct whatever bytes a block holds.
- "multiply": the kernel reads whole blocks and multiplies exp(scores) by a 0/1 mask, the
  pattern behind vLLM #35138: finite stale bytes vanish, NaN survives (0 x NaN = NaN).

Capture mode also returns the attention probabilities of chosen query rows, per head,
computed exactly as the output is (so leakage is measured on what the model used).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ROW_CHUNK = 256  # query rows per manual-attention chunk (bounds [H, rows, L] memory)


def _manual(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, mode: str,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, T, D]; k, v: [B, KVH, L, D]; allowed: [B or 1, 1, T, L] bool.
    Returns out [B, H, T, D] and probs [B, H, T, L] (fp32)."""
    b, h, t, d = q.shape
    kvh = k.shape[1]
    qg = q.reshape(b, kvh, h // kvh, t, d).float()
    scores = torch.einsum("bkgtd,bkld->bkgtl", qg, k.float()) * scale
    scores = scores.reshape(b, h, t, -1)
    if mode == "multiply":
        m = scores.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True)
        w = torch.exp(scores - m) * allowed  # 0 x NaN = NaN: stale NaN bytes leak
        probs = w / w.sum(-1, keepdim=True)
    else:
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    pg = probs.reshape(b, kvh, h // kvh, t, -1)
    out = torch.einsum("bkgtl,bkld->bkgtd", pg, v.float()).reshape(b, h, t, d)
    return out.to(q.dtype), probs


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                      ctx_len: int, mode: str, scale: float, capture_last: bool
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One sequence. q: [T, H, D] at positions q_start..q_start+T-1; k, v: [L, KVH, D] with
    L >= ctx_len = q_start + T (L > ctx_len only in multiply mode: whole blocks).
    Returns out [T, H, D] and, if capture_last, the last row's probs [H, L]."""
    t = q.shape[0]
    length = k.shape[0]
    qb, kb, vb = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    rows = torch.arange(q_start, q_start + t, device=q.device)[:, None]
    cols = torch.arange(length, device=q.device)[None, :]
    probs_last = None
    if mode == "additive":
        if q_start == 0 and length == t:
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=True)
        else:
            mask = cols <= rows
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
        out = out[0].transpose(0, 1)
        if capture_last:
            _, p = _manual(qb[:, :, -1:], kb, vb, (cols <= rows[-1:])[None, None], mode, scale)
            probs_last = p[0, :, 0]
        return out, probs_last
    outs = []
    for r0 in range(0, t, _ROW_CHUNK):
        r1 = min(t, r0 + _ROW_CHUNK)
        allowed = ((cols <= rows[r0:r1]) & (cols < ctx_len))[None, None]
        o, p = _manual(qb[:, :, r0:r1], kb, vb, allowed, mode, scale)
        outs.append(o[0].transpose(0, 1))
        if capture_last and r1 == t:
            probs_last = p[0, :, -1]
    return torch.cat(outs), probs_last


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                     mode: str, scale: float, capture: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A padded batch, one query each. q: [B, H, D]; k, v: [B, L, KVH, D]; valid: [B, L]
    (slots inside each sequence's context). Returns out [B, H, D] and probs [B, H, L]."""
    qb = q[:, :, None]  # [B, H, 1, D]
    kb, vb = k.transpose(1, 2), v.transpose(1, 2)  # [B, KVH, L, D]
    allowed = valid[:, None, None, :]
    if mode == "additive" and not capture:
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, scale=scale, enable_gqa=True)
        return out[:, :, 0], None
    out, probs = _manual(qb, kb, vb, allowed, mode, scale)
    return out[:, :, 0], probs[:, :, 0]
