"""Provenance of K/V, with nothing but numpy: the fingerprint of the token prefix whose K/V
a slot holds. The reference engine's ledger (kv_cache.py) and kvdiag's sentinel inside live
engines (kvdiag.sentinel) both keep one per slot and compare it with the reader's own: equal
prefixes give equal fingerprints, whichever request wrote them.
"""

from __future__ import annotations

import numpy as np

UNWRITTEN = 0  # ledger value of a slot nobody wrote since its block was allocated

_P = np.uint64(0x100000001B3)  # odd, so invertible mod 2**64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Fingerprints:
    """Per-position 64-bit fingerprints of a token prefix: fp[i] depends on tokens[0..i] and
    nothing else, so the same prefix gives the same fingerprint whichever sequence wrote it.

    raw[i] = raw[i-1] * P + (token_i + 1)  (mod 2**64), published = mix(raw) (never 0).
    Computed for the whole prompt at once (a scan via powers of P and P^-1), then extended
    token by token as the sequence decodes.

    `namespace` (raw[-1], default 0) separates K/V that the same tokens give under other
    weights: an adapter, or the model after a weight update. Equal tokens in two namespaces
    get unrelated fingerprints, so reading across them is a foreign read.
    """

    def __init__(self, token_ids, namespace: int = 0) -> None:
        t = np.asarray(token_ids, dtype=np.uint64) + np.uint64(1)
        n = len(t)
        with np.errstate(over="ignore"):
            p_pow = np.concatenate([[np.uint64(1)], np.cumprod(np.full(max(n - 1, 0), _P, dtype=np.uint64))])[:n]
            p_inv = np.concatenate([[np.uint64(1)], np.cumprod(np.full(max(n - 1, 0), _P_INV, dtype=np.uint64))])[:n]
            raw = p_pow * np.cumsum(t * p_inv, dtype=np.uint64)
            if namespace:  # + namespace * P^(i+1)
                raw = raw + p_pow * np.uint64(namespace & _MASK) * _P
        self._last_raw = int(raw[-1]) if n else namespace & _MASK
        self._values = np.empty(max(16, 2 * n), dtype=np.int64)
        self._n = n
        self._values[:n] = self._publish(raw)

    @staticmethod
    def _publish(raw: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            out = _mix(raw).view(np.int64)
        out[out == UNWRITTEN] = 1
        return out

    def append(self, token_id: int) -> None:
        self._last_raw = raw = (self._last_raw * int(_P) + token_id + 1) & _MASK
        if self._n == len(self._values):
            self._values = np.concatenate([self._values, np.empty_like(self._values)])
        # splitmix64 finaliser on a Python int: the same value _mix gives, without numpy calls
        raw = ((raw ^ (raw >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        raw = ((raw ^ (raw >> 27)) * 0x94D049BB133111EB) & _MASK
        raw ^= raw >> 31
        value = raw - (1 << 64) if raw >> 63 else raw
        self._values[self._n] = value if value != UNWRITTEN else 1
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def values(self, start: int = 0, end: int | None = None) -> np.ndarray:
        end = self._n if end is None else end
        return self._values[start:end]
