"""The canary's weights, set by hand: an induction circuit over a word-level vocabulary.

Residual stream (HIDDEN = 384 dims, each circuit in its own orthogonal block):

    0        anchor   pads every embedding to norm sqrt(HIDDEN), so each RMSNorm is ~1
    1..4     flags    is_key, is_im_start, is_im_end, is_sink (the word "unknown")
    5..20    cc       content code (keys share the code of "assistant": START)
    21..36   kc       key code (keys only)
    37..164  r        readout code (".": that of <|im_end|>; <|im_start|>: that of "unknown")
    165..180 P1       layer 1: cc of the previous token
    181..196 CKq      layer 1: kc of the most recent key in offsets 0..9
    197..212 CKk      layer 1: kc of the most recent key in offsets 1..10
    213..340 OUT      layer 2: r of the retrieved token

Layer 1 (bias-only queries; one shared KV head): head 0 = P1, head 1 = CKq, head 2 = CKk.
Layer 2 head 0 scores position s for query t as
    A <kc(CKq(t)), kc(CKk(s))> + B <cc(x_t), cc(P1(s))> + sigma [x_s = <|im_start|>] - M [x_s = <|im_end|>]
i.e. "same current key, and the token before s is the token at t": it copies the token that
followed the current context, or falls back to the <|im_start|> sink (read out as the word "unknown").
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvdiag.canary import design as D
from kvdiag.canary.vocab import IM_END, IM_START, Vocab, token
from kvdiag.facts.words import SINK, STOP

DATA = Path(__file__).resolve().parent

# residual blocks
ANCHOR, F_KEY, F_START, F_END, F_SINK = 0, 1, 2, 3, 4
CC = slice(5, 5 + D.CONTENT_DIM)
KC = slice(CC.stop, CC.stop + D.KEY_DIM)
R = slice(KC.stop, KC.stop + D.HEAD_DIM)
P1 = slice(R.stop, R.stop + D.CONTENT_DIM)
CKQ = slice(P1.stop, P1.stop + D.KEY_DIM)
CKK = slice(CKQ.stop, CKQ.stop + D.KEY_DIM)
OUT = slice(CKK.stop, CKK.stop + D.HEAD_DIM)
assert OUT.stop <= D.HIDDEN

# layer-1 value layout: [cc | kc]
V_CC = slice(0, D.CONTENT_DIM)
V_KC = slice(D.CONTENT_DIM, D.CONTENT_DIM + D.KEY_DIM)


@dataclass(frozen=True)
class Gains:
    """Logit-scale constants (attention logits unless noted)."""

    key_match: float = 56.0  # A
    content_match: float = 30.0  # B
    sink: float = 69.5  # sigma: below A + B, above A * rho_key + B
    end_penalty: float = 60.0  # M: <|im_end|> positions are never copied
    start_override: float = 250.0  # Z: <|im_start|> queries attend to <|im_start|> keys only
    write: float = 0.25  # layer outputs written into the residual at this norm
    readout: float = 60.0  # lm_head scale on the retrieved code (final-logit units)
    sink_to_end: float = 120.0  # after the sink word, emit <|im_end|>


def _signs(token: str, n: int) -> np.ndarray:
    """Deterministic +-1/sqrt(n) code from sha256 (stable across machines and versions)."""
    bits = hashlib.sha256(f"canary-readout:{token}".encode()).digest()
    while len(bits) * 8 < n:
        bits += hashlib.sha256(bits).digest()
    b = np.unpackbits(np.frombuffer(bits, dtype=np.uint8))[:n]
    return np.where(b == 1, 1.0, -1.0).astype(np.float32) / np.float32(np.sqrt(n))


def load_inputs() -> tuple[dict, np.ndarray, np.ndarray]:
    profiles = json.loads((DATA / "profiles.json").read_text())
    return profiles, np.load(DATA / "key_codes.npy"), np.load(DATA / "content_codes.npy")


def _pair_dims(pairs: tuple[int, ...]) -> list[int]:
    """Code dim j -> head dim: real part of pair j//2 for even j, imaginary part for odd j."""
    return [pairs[j // 2] + (D.HALF if j % 2 else 0) for j in range(2 * len(pairs))]


def embeddings(vocab: Vocab, key_codes: np.ndarray, content_codes: np.ndarray) -> np.ndarray:
    """[V, HIDDEN] float64. Junk tokens (bytes, merge intermediates) get the anchor only."""
    if len(key_codes) != len(vocab.keys) or len(content_codes) != len(vocab.content):
        raise RuntimeError("canary codes do not match the vocabulary: rerun "
                           "scripts/optimize_canary_codes.py")
    ids = vocab.ids
    E = np.zeros((len(vocab), D.HIDDEN), dtype=np.float64)
    for i, tok in enumerate(vocab.keys):
        E[ids[tok], F_KEY] = 1.0
        E[ids[tok], KC] = key_codes[i]
        E[ids[tok], CC] = content_codes[vocab.content.index("assistant")]  # START
    for i, tok in enumerate(vocab.content):
        E[ids[tok], CC] = content_codes[i]
    alias = {token(STOP): IM_END, IM_START: token(SINK)}  # read out as
    for tok in (*vocab.keys, *vocab.content, IM_START):
        E[ids[tok], R] = _signs(alias.get(tok, tok), D.HEAD_DIM)
    E[ids[IM_START], F_START] = 1.0
    E[ids[IM_END], F_END] = 1.0
    E[ids[token(SINK)], F_SINK] = 1.0
    for i in range(len(vocab)):
        E[i, ANCHOR] = math.sqrt(D.HIDDEN - math.fsum(E[i] ** 2))  # fsum: exact, portable
    return E


def layer1(profiles: dict) -> dict[str, np.ndarray]:
    """P1, CKq, CKk: positional heads over one shared key (bias + is_key + is_im_start)."""
    hd, scale, g = D.HEAD_DIM, np.sqrt(D.HEAD_DIM), Gains()
    q_b = np.zeros(D.NUM_HEADS * hd)
    q_w = np.zeros((D.NUM_HEADS * hd, D.HIDDEN))
    k_b = np.zeros(hd)
    k_w = np.zeros((hd, D.HIDDEN))
    p1 = np.array(profiles["p1"]["coef"])
    ck = np.array(profiles["ck"]["coef"])
    ck_k = np.array(profiles["ck"]["coef_shifted"])  # key side: offsets 1..10
    for head, (pairs, coef) in enumerate(((D.P1_PAIRS, p1), (D.CK_PAIRS, ck), (D.CK_PAIRS, ck_k))):
        n = len(pairs)
        for j, p in enumerate(pairs):
            # query pair (a, -b) against key pair (1, 0) scores a cos + b sin
            q_b[head * hd + p] = scale * coef[j]
            q_b[head * hd + p + D.HALF] = -scale * coef[n + j]
        q_w[head * hd + D.FLAG_PAIR, F_START] = scale * g.start_override
    for p in D.P1_PAIRS:
        k_b[p] = 1.0
    for p in D.CK_PAIRS:
        k_w[p, F_KEY] = 1.0
    k_w[D.FLAG_PAIR, F_START] = 1.0
    v_w = np.zeros((hd, D.HIDDEN))
    v_w[V_CC, CC] = np.eye(D.CONTENT_DIM)
    v_w[V_KC, KC] = np.eye(D.KEY_DIM)
    o_w = np.zeros((D.HIDDEN, D.NUM_HEADS * hd))
    o_w[P1, 0 * hd + V_CC.start:0 * hd + V_CC.stop] = g.write * np.eye(D.CONTENT_DIM)
    o_w[CKQ, 1 * hd + V_KC.start:1 * hd + V_KC.stop] = g.write * np.eye(D.KEY_DIM)
    o_w[CKK, 2 * hd + V_KC.start:2 * hd + V_KC.stop] = g.write * np.eye(D.KEY_DIM)
    return {"q_w": q_w, "q_b": q_b, "k_w": k_w, "k_b": k_b, "v_w": v_w, "o_w": o_w}


def layer2() -> dict[str, np.ndarray]:
    """Retrieval head 0; heads 1 and 2 are off (zero query, zero output)."""
    hd, scale, g = D.HEAD_DIM, np.sqrt(D.HEAD_DIM), Gains()
    q_w = np.zeros((D.NUM_HEADS * hd, D.HIDDEN))
    q_b = np.zeros(D.NUM_HEADS * hd)
    k_w = np.zeros((hd, D.HIDDEN))
    for j, dim in enumerate(_pair_dims(D.KEY_PAIRS)):
        q_w[dim, CKQ.start + j] = scale * g.key_match / g.write
        k_w[dim, CKK.start + j] = 1.0 / g.write
    for j, dim in enumerate(_pair_dims(D.CONTENT_PAIRS)):
        q_w[dim, CC.start + j] = scale * g.content_match
        k_w[dim, P1.start + j] = 1.0 / g.write
    q_b[D.FLAG_PAIR] = scale
    k_w[D.FLAG_PAIR, F_START] = g.sink
    k_w[D.FLAG_PAIR, F_END] = -g.end_penalty
    v_w = np.zeros((hd, D.HIDDEN))
    v_w[:, R] = np.eye(hd)
    o_w = np.zeros((D.HIDDEN, D.NUM_HEADS * hd))
    o_w[OUT, 0:hd] = g.write * np.eye(hd)
    return {"q_w": q_w, "q_b": q_b, "k_w": k_w, "k_b": np.zeros(hd), "v_w": v_w, "o_w": o_w}


def lm_head(vocab: Vocab, E: np.ndarray) -> np.ndarray:
    """Reads the retrieved code; never emits junk, "." or <|im_start|> (their codes are
    those of <|im_end|> and the sink); after the sink word, emits <|im_end|>."""
    g, ids = Gains(), vocab.ids
    W = np.zeros((len(vocab), D.HIDDEN))
    for tok in (*vocab.keys, *vocab.content):
        W[ids[tok], OUT] = E[ids[tok], R] * (g.readout / g.write)
    W[ids[token(STOP)]] = 0.0
    W[ids[IM_END], F_SINK] = g.sink_to_end
    return W


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, as torch does.
    Integer arithmetic only, so identical on every machine (no NaN or inf occurs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest bfloat16, as float32 (exactly what the checkpoint stores)."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def state_dict(vocab: Vocab) -> dict[str, np.ndarray]:
    """Every tensor of the Qwen2ForCausalLM checkpoint, float32, HF names. build.py stores
    them rounded to bfloat16 (bf16_bits); every margin is measured on the rounded weights."""
    profiles, key_codes, content_codes = load_inputs()
    E = embeddings(vocab, key_codes, content_codes)
    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": E, "lm_head.weight": lm_head(vocab, E),
                                 "model.norm.weight": np.ones(D.HIDDEN)}
    for i, layer in enumerate((layer1(profiles), layer2())):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = layer["q_w"]
        sd[p + "self_attn.q_proj.bias"] = layer["q_b"]
        sd[p + "self_attn.k_proj.weight"] = layer["k_w"]
        sd[p + "self_attn.k_proj.bias"] = layer["k_b"]
        sd[p + "self_attn.v_proj.weight"] = layer["v_w"]
        sd[p + "self_attn.v_proj.bias"] = np.zeros(D.HEAD_DIM)
        sd[p + "self_attn.o_proj.weight"] = layer["o_w"]
        sd[p + "input_layernorm.weight"] = np.ones(D.HIDDEN)
        sd[p + "post_attention_layernorm.weight"] = np.ones(D.HIDDEN)
        sd[p + "mlp.gate_proj.weight"] = np.zeros((D.INTERMEDIATE, D.HIDDEN))
        sd[p + "mlp.up_proj.weight"] = np.zeros((D.INTERMEDIATE, D.HIDDEN))
        sd[p + "mlp.down_proj.weight"] = np.zeros((D.HIDDEN, D.INTERMEDIATE))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}
