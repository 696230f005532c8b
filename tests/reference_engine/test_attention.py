"""The two masking modes of the attention kernels. Additive masks scores with -inf (and the
paged backend never gathers a slot outside the context). Multiply reads whole blocks and
multiplies exp(scores) by a 0/1 mask: finite stale bytes vanish, NaN does not (0 x NaN =
NaN), the pattern of vLLM #35138. On clean input both agree."""

from __future__ import annotations

import pytest
import torch

from reference_engine.attention import decode_attention, prefill_attention

H, KVH, D = 4, 2, 8
SCALE = D ** -0.5


def _qkv(t: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, H, D, generator=g), torch.randn(length, KVH, D, generator=g),
            torch.randn(length, KVH, D, generator=g))


def _stale(k, v, ctx: int, value: float):
    k, v = k.clone(), v.clone()
    k[ctx:], v[ctx:] = value, value
    return k, v


@pytest.mark.parametrize("q_start", [0, 5])
def test_prefill_modes_agree_on_clean_input(q_start):
    t, ctx = 6, q_start + 6
    q, k, v = _qkv(t, ctx)
    add, p_add = prefill_attention(q, k, v, q_start, ctx, "additive", SCALE, True)
    mul, p_mul = prefill_attention(q, k, v, q_start, ctx, "multiply", SCALE, True)
    torch.testing.assert_close(add, mul, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p_add, p_mul, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p_add.sum(-1), torch.ones(H))


def test_prefill_multiply_ignores_finite_stale_tail_and_leaks_nan():
    """A whole block is read (L = 16 slots) though the context holds 11."""
    t, ctx, length = 3, 11, 16
    q, k, v = _qkv(t, length)
    clean, _ = prefill_attention(q, *_stale(k, v, ctx, 0.0), ctx - t, ctx, "multiply", SCALE, False)
    # finite bytes of another tenant's scale (huge ones would overflow exp() to inf, and
    # inf x 0 is NaN too)
    big, probs = prefill_attention(q, *_stale(k, v, ctx, 2.0), ctx - t, ctx, "multiply", SCALE, True)
    torch.testing.assert_close(clean, big)
    assert (probs[:, ctx:] == 0).all()  # finite stale slots get exactly no weight
    nan, _ = prefill_attention(q, *_stale(k, v, ctx, float("nan")), ctx - t, ctx, "multiply", SCALE, False)
    assert torch.isnan(nan).all()


def test_decode_masks_finite_stale_slots_and_only_multiply_lets_nan_through():
    """The kernel masks; it is the paged backend that keeps NaN out in additive mode, by
    gathering only the context and padding from the zeroed null block. Here the kernel is
    given NaN in masked slots: additive -inf masking with finite garbage is exact, and
    multiply turns NaN into NaN output for every row that holds a masked slot."""
    b, length = 3, 16
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, H, D, generator=g)
    k, v = torch.randn(b, length, KVH, D, generator=g), torch.randn(b, length, KVH, D, generator=g)
    valid = torch.zeros(b, length, dtype=torch.bool)
    for i, n in enumerate((16, 9, 3)):
        valid[i, :n] = True
    clean, _ = decode_attention(q, k, v, valid, "additive", SCALE, False)
    stale_k, stale_v = k.clone(), v.clone()
    stale_k[~valid], stale_v[~valid] = 2.0, -2.0
    for mode in ("additive", "multiply"):
        for capture in (False, True):
            out, probs = decode_attention(q, stale_k, stale_v, valid, mode, SCALE, capture)
            torch.testing.assert_close(out, clean, rtol=1e-5, atol=1e-5)
            if probs is not None:
                assert (probs[~valid[:, None, :].expand_as(probs)] == 0).all()
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[~valid], poisoned_v[~valid] = float("nan"), float("nan")
    out, _ = decode_attention(q, poisoned_k, poisoned_v, valid, "multiply", SCALE, True)
    assert torch.isfinite(out[0]).all()  # row 0 reads no masked slot
    assert torch.isnan(out[1:]).all()  # rows 1, 2 multiply NaN by 0


def test_decode_modes_agree_on_clean_input():
    b, length = 2, 12
    g = torch.Generator().manual_seed(2)
    q = torch.randn(b, H, D, generator=g)
    k, v = torch.randn(b, length, KVH, D, generator=g), torch.randn(b, length, KVH, D, generator=g)
    valid = torch.ones(b, length, dtype=torch.bool)
    valid[1, 7:] = False
    add, _ = decode_attention(q, k, v, valid, "additive", SCALE, False)
    mul, probs = decode_attention(q, k, v, valid, "multiply", SCALE, True)
    torch.testing.assert_close(add, mul, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(b, H))
