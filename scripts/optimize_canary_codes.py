"""Offline optimisation of the canary's build inputs (run once; results are committed).

Writes into kvdiag/canary/:
  profiles.json      RoPE coefficients of the layer-1 positional heads (P1, CK), found by
                     maximising the worst-case margin (a soft-min LP) over all offsets
  key_codes.npy      [640, 16] float32 unit vectors for the key tokens
  content_codes.npy  [N, 16]   float32 unit vectors for the content tokens
Codes minimise the largest signed inner product between two different tokens (a negative
one only lowers a wrong match). Takes a few minutes on 2 CPU cores.

    .venv/bin/python scripts/optimize_canary_codes.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from kvdiag.canary import design as D
from kvdiag.canary.vocab import canary_vocab

OUT = Path(__file__).resolve().parents[1] / "kvdiag" / "canary"


def soft_lp(a: np.ndarray, t: np.ndarray, steps: int) -> tuple[np.ndarray, float]:
    """max over ||x||_2 = 1 of min_j (a_j . x) / t_j, by annealed soft-min and Adam."""
    A = torch.tensor(a / t[:, None], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(A.shape[1], dtype=torch.float64, generator=g).requires_grad_()
    opt = torch.optim.Adam([y], lr=3e-2)
    for step in range(steps):
        beta = 20.0 * (1000.0 ** (step / steps))
        x = y / y.norm()
        m = A @ x
        loss = torch.logsumexp(-beta * m, 0) / beta
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == steps // 2:
            for group in opt.param_groups:
                group["lr"] = 3e-3
    x = (y / y.norm()).detach().numpy()
    return x, float((a @ x / t).min())


def p1_profile(steps: int) -> dict:
    offs = np.array([0, *range(2, D.MAX_POSITIONS + 1)])
    basis_1 = D.profile_basis(D.P1_PAIRS, np.array([1]))
    a = basis_1 - D.profile_basis(D.P1_PAIRS, offs)  # f(1) - f(d) >= margin
    x, lam = soft_lp(a, np.ones(len(offs)), steps)
    coef = x * (D.P1_MARGIN / lam)
    return {"pairs": list(D.P1_PAIRS), "coef": coef.tolist(), "margin_per_unit_l2": lam}


def ck_profile(steps: int) -> dict:
    w, g = D.CK_WINDOW, D.MIN_KEY_GAP
    inside = np.arange(0, w)
    outside = np.array([-1, *range(w, D.MAX_POSITIONS + 1)])
    rows, targets = [], []
    rows.append(D.profile_basis(D.CK_PAIRS, inside))
    targets.append(np.full(len(inside), D.CK_IN))
    rows.append(-D.profile_basis(D.CK_PAIRS, outside))
    targets.append(np.full(len(outside), D.CK_OUT))
    # two keys in the window, the older one at least MIN_KEY_GAP further back: newer wins
    newer, older = zip(*[(d1, d2) for d1 in range(w) for d2 in range(d1 + g, w)])
    rows.append(D.profile_basis(D.CK_PAIRS, np.array(newer)) - D.profile_basis(D.CK_PAIRS, np.array(older)))
    targets.append(np.full(len(newer), D.CK_RECENCY))
    a, t = np.concatenate(rows), np.concatenate(targets)
    x, lam = soft_lp(a, t, steps)
    coef = x / lam
    # the key-side head sees the same window one position later; stored, not recomputed
    # at build time, so the build does no libm calls whose last bit may vary by machine
    shifted = D.shift_coefficients(coef, D.CK_PAIRS, 1)
    return {"pairs": list(D.CK_PAIRS), "coef": coef.tolist(), "coef_shifted": shifted.tolist(),
            "margin_per_unit_l2": lam}


def spherical_code(n: int, d: int, steps: int, seed: int) -> np.ndarray:
    """n unit vectors in R^d with a small largest pairwise inner product."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(n, d, dtype=torch.float64, generator=g).requires_grad_()
    opt = torch.optim.Adam([y], lr=1e-2)
    mask = ~torch.eye(n, dtype=torch.bool)
    for step in range(steps):
        beta = 10.0 * (100.0 ** (step / steps))
        x = y / y.norm(dim=1, keepdim=True)
        ip = (x @ x.T)[mask]
        loss = torch.logsumexp(beta * ip, 0) / beta
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = (y / y.norm(dim=1, keepdim=True)).detach()
    return x.numpy().astype(np.float32)


def max_ip(x: np.ndarray) -> float:
    x = x.astype(np.float64)
    ip = x @ x.T
    np.fill_diagonal(ip, -np.inf)
    return float(ip.max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--only", choices=("profiles", "codes"), default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    vocab = canary_vocab()
    if args.only in (None, "profiles"):
        p1, ck = p1_profile(args.steps), ck_profile(args.steps)
        print(f"P1 margin/unit-L2 {p1['margin_per_unit_l2']:.4f}, "
              f"L2 {np.linalg.norm(p1['coef']):.1f}")
        print(f"CK margin/unit-L2 {ck['margin_per_unit_l2']:.4f}, "
              f"L2 {np.linalg.norm(ck['coef']):.1f}")
        (OUT / "profiles.json").write_text(json.dumps({"p1": p1, "ck": ck}, indent=1) + "\n")
    if args.only in (None, "codes"):
        keys = spherical_code(len(vocab.keys), D.KEY_DIM, args.steps, seed=1)
        content = spherical_code(len(vocab.content), D.CONTENT_DIM, args.steps, seed=2)
        print(f"key codes {keys.shape} max ip {max_ip(keys):.3f}; "
              f"content codes {content.shape} max ip {max_ip(content):.3f}")
        np.save(OUT / "key_codes.npy", keys)
        np.save(OUT / "content_codes.npy", content)


if __name__ == "__main__":
    main()
