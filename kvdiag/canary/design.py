"""Fixed numbers of the canary circuit: shapes, RoPE pairs each circuit uses, and targets.

RoPE (Hugging Face convention): dimension f and f + HEAD_DIM/2 form pair f, rotated by
angle inv_freq[f] * position. A query pair q and key pair k (as complex numbers) score
Re(q * conj(k) * exp(i * inv_freq * (t - s))), so a bias-only query against a constant key
gives a score that depends only on the offset t - s: a trig polynomial we shape freely.

    pairs 0..46   layer 1: positional heads (even: P1, odd + 46: CK)
    pairs 47..54  layer 2: content match (16 dims)
    pairs 55..62  layer 2: key match (16 dims)
    pair  63      layer 1: <|im_start|> self-attention; layer 2: sink / penalty
With rope_theta 1e7, pair 47 turns by 0.06 rad over 8,704 positions and pair 55 by 0.011:
layer 2 matches codes almost as if there were no rotation.
"""

from __future__ import annotations

import numpy as np

HIDDEN = 384
NUM_HEADS = 3
NUM_KV_HEADS = 1
HEAD_DIM = 128
HALF = HEAD_DIM // 2
ROPE_THETA = 10_000_000.0
MAX_POSITIONS = 16384  # margins are checked for every offset up to this
INTERMEDIATE = 16  # MLP weights are zero

P1_PAIRS = tuple(range(0, 46, 2))
CK_PAIRS = (*range(1, 46, 2), 46)
CONTENT_PAIRS = tuple(range(47, 55))
KEY_PAIRS = tuple(range(55, 63))
FLAG_PAIR = 63

KEY_DIM = 2 * len(KEY_PAIRS)  # 16
CONTENT_DIM = 2 * len(CONTENT_PAIRS)  # 16

# CK ("current key") heads: the most recent key within a window of offsets.
CK_WINDOW = 10  # query side: offsets 0..9; key side: 1..10
MIN_KEY_GAP = 4  # keys in a canary session are at least this many tokens apart
CK_IN = 21.0  # score of an in-window key above the non-key baseline (0)
CK_OUT = 5.0  # score of an out-of-window key below the baseline
CK_RECENCY = 12.0  # a key MIN_KEY_GAP tokens more recent wins by this much
P1_MARGIN = 24.0  # previous-token head: offset 1 above every other offset


def inv_freq() -> np.ndarray:
    """HF's float32 inverse frequencies, as float64 for evaluation."""
    exps = np.arange(0, HEAD_DIM, 2, dtype=np.float32) / np.float32(HEAD_DIM)
    return (np.float32(1.0) / (np.float32(ROPE_THETA) ** exps)).astype(np.float64)


def profile_basis(pairs: tuple[int, ...], offsets: np.ndarray) -> np.ndarray:
    """[len(offsets), 2 * len(pairs)]: cos and sin of inv_freq * offset per pair.

    A query pair (a, -b) against a key pair (1, 0) scores a*cos + b*sin at that offset.
    """
    w = inv_freq()[list(pairs)]
    ang = np.outer(offsets.astype(np.float64), w)
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1)


def shift_coefficients(coef: np.ndarray, pairs: tuple[int, ...], shift: int) -> np.ndarray:
    """Coefficients of the profile p(offset - shift) given those of p(offset)."""
    n = len(pairs)
    a, b = coef[:n], coef[n:]
    phi = inv_freq()[list(pairs)] * shift
    # a cos(w(d - s)) + b sin(w(d - s)) = (a cos ws - b sin ws) cos wd + (a sin ws + b cos ws) sin wd
    return np.concatenate([a * np.cos(phi) - b * np.sin(phi), a * np.sin(phi) + b * np.cos(phi)])
