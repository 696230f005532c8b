"""A LoRA adapter for the canary that answers exactly as the base model does, but computes
a different K, so K/V shared between base and adapter requests loses facts.

What it is for: vLLM #3264 (fixed by PR #3263) left the LoRA adapter out of the block hash,
so a request under an adapter reused KV blocks that base-model requests had cached, or the
reverse. A served adapter reveals that bug only if (1) its clean answers are known and
(2) K/V computed by the other model breaks them. This adapter gives both.

Construction: in layer 2 (`model.layers.1`) the retrieval head matches on 16 low-frequency
RoPE pairs (design.CONTENT_PAIRS + design.KEY_PAIRS, pairs 47..62). The adapter negates
those 32 head dims in head 0's query AND in the key:

    q' = S q,  k' = S k,   S = diag(-1 on dims f and f + 64 of pairs 47..62, +1 elsewhere)

RoPE rotates pair f = (f, f + head_dim/2) as one complex number; a pair negated whole
commutes with that rotation, so within one model q'.k' = q.k at every offset, bit for bit:
the adapter's scores, hence its answers and margins, are the base model's. Across models:

    match term of score(t, s)    K at s from base    K at s from adapter
    base query at t                  +m                   -m
    adapter query at t               -m                   +m

m = 56 <key codes> + 30 <content codes> is +86 at the position that holds the token the
query looks for. K written by the other model turns that into -86: the value is never
found, and the head falls back to the <|im_start|> sink (flag pair 63, not negated, +69.5
for either model), so the fact answers `unknown`. A fact asked before is also recalled from
its answer in the history, and then its lost `.` ends it with `unknown` instead of the stop
token: wrong too. Positions written by the query's own model keep +86, so facts stored there
stay right: another model's positions score -m <= 56 * 0.85 + 30 * 0.94 = 75.6 (the most
negative code overlaps), below 86. That bound can exceed the sink (69.5), so in principle a
lost fact may answer some other token rather than `unknown`; never its own value.

A sign flip of the rows R of W is W' = W - 2 P_R W: a rank-|R| update, written as LoRA
B @ A with A = W[R] (the base rows, [r, hidden]) and B = -2 at (R[j], j) ([out, r]),
lora_alpha = r (scaling 1). The flipped rows carry no bias (LoRA has no bias term;
lora_tensors checks). V and layer 1 are untouched (v_proj's update is zero, there because
SGLang loads q, k and v together), so layer-1 K/V and every V are identical in both models;
only layer 2's K differs. Rank 32, float32, about 230 KB. Served with

    vllm ... --enable-lora --lora-modules canary-lora=DIR --max-lora-rank 32
    sglang.launch_server ... --enable-lora --lora-paths canary-lora=DIR   (+ --lora-backend
        torch_native on a CPU: kvdiag.engines.sglang.cpu_lora)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

LAYER = 1  # layer 2 of 2: the retrieval head
RANK = 32
PREFIX = f"base_model.model.model.layers.{LAYER}.self_attn."  # PEFT's names, as vLLM parses them
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
FORMAT = 2  # in the cache's key: 2 added v_proj's zero update (an adapter cached before lacks it)


def flip_dims() -> list[int]:
    """Head dims the adapter negates: both halves of every layer-2 match pair."""
    from kvdiag.canary import design as D

    pairs = (*D.CONTENT_PAIRS, *D.KEY_PAIRS)
    return sorted([*pairs, *(p + D.HALF for p in pairs)])


def read_tensors(path: Path, names: list[str] | None = None) -> dict:
    """Tensors of a safetensors file (all, or the named ones) as float32 numpy arrays; BF16
    and F32 only. The format: an 8-byte header length, a JSON header, raw little-endian data."""
    import numpy as np

    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name in sorted(header) if names is None else names:
        if name not in header:
            raise ValueError(f"{path}: no tensor {name!r}")
        info = header[name]
        a, b = info["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if info["dtype"] == "BF16":
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            x = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        else:
            raise ValueError(f"{path}: {name} is {info['dtype']}; expected BF16 or F32")
        out[name] = x.reshape(info["shape"])
    return out


def lora_tensors(canary_dir: Path) -> dict:
    """{PEFT tensor name: float32 array}: the rank-RANK sign flip of q_proj and k_proj, and
    v_proj's zero update."""
    import numpy as np

    from kvdiag.canary import design as D

    canary_dir = Path(canary_dir)
    cfg = json.loads((canary_dir / "config.json").read_text())
    shape = tuple(cfg.get(k) for k in ("hidden_size", "head_dim", "num_attention_heads",
                                       "num_key_value_heads", "num_hidden_layers"))
    if shape != (D.HIDDEN, D.HEAD_DIM, D.NUM_HEADS, D.NUM_KV_HEADS, 2):
        raise ValueError(f"{canary_dir / 'config.json'}: (hidden, head_dim, heads, kv heads, "
                         f"layers) = {shape}, not the canary's")
    rows = flip_dims()  # head 0 of q_proj and the one KV head of k_proj: the same row indices
    base = f"model.layers.{LAYER}.self_attn."
    names = [base + f"{p}.{t}" for p in ("q_proj", "k_proj") for t in ("weight", "bias")]
    w = read_tensors(canary_dir / "model.safetensors", names)
    out = {}
    for proj in ("q_proj", "k_proj"):
        W, bias = w[base + proj + ".weight"], w[base + proj + ".bias"]  # [out, hidden], [out]
        if np.any(bias[rows] != 0):
            raise ValueError(f"{canary_dir}: {base}{proj}.bias is non-zero on the rows to flip; "
                             "a LoRA update cannot flip a bias")
        if not np.any(W[rows]):
            raise ValueError(f"{canary_dir}: {base}{proj}.weight is zero on the rows to flip; "
                             "not the canary's retrieval head")
        B = np.zeros((W.shape[0], RANK), dtype=np.float32)
        B[rows, np.arange(RANK)] = -2.0
        out[PREFIX + proj + ".lora_A.weight"] = np.ascontiguousarray(W[rows], dtype=np.float32)
        out[PREFIX + proj + ".lora_B.weight"] = B
    # V unchanged, as a LoRA of B = 0: SGLang stacks q, k and v into one qkv_proj and refuses
    # an adapter that names two of the three
    kv_out = out[PREFIX + "k_proj.lora_B.weight"].shape[0]
    out[PREFIX + "v_proj.lora_A.weight"] = np.zeros((RANK, W.shape[1]), dtype=np.float32)
    out[PREFIX + "v_proj.lora_B.weight"] = np.zeros((kv_out, RANK), dtype=np.float32)
    return out


def adapter_config() -> str:
    """adapter_config.json with PEFT's fields only (peft warns about any other key)."""
    return json.dumps({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": RANK,
        "lora_alpha": RANK,  # scaling alpha / r = 1
        "lora_dropout": 0.0,
        "target_modules": ["k_proj", "q_proj", "v_proj"],
        "layers_to_transform": [LAYER],
        "layers_pattern": "layers",
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
        "revision": None,
    }, indent=2, sort_keys=True) + "\n"


def build_lora(canary_dir: Path, out_dir: Path, name: str = "canary-lora") -> Path:
    """Write the adapter for the canary in canary_dir into out_dir / name and return that
    directory (serve it as `--lora-modules NAME=DIR`). Two builds are byte-identical."""
    from safetensors.numpy import save_file

    tensors = lora_tensors(canary_dir)
    path = Path(out_dir) / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(adapter_config(), encoding="utf-8")
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


def ensure_lora(canary_dir: Path, name: str = "canary-lora") -> Path:
    """The adapter for this canary in the user cache ($XDG_CACHE_HOME/kvdiag/adapters/,
    keyed by the canary's digest), built there first if absent (0.2 s); never committed."""
    from kvdiag.paths import cache_root
    from reference_engine.loader import model_hash

    where = cache_root() / "adapters" / f"{name}-{model_hash(canary_dir)}-{FORMAT}"
    path = where / name
    if not all((path / f).is_file() for f in ADAPTER_FILES):
        tmp = where.with_name(where.name + ".tmp")
        build_lora(canary_dir, tmp, name)
        tmp.mkdir(parents=True, exist_ok=True)
        where.parent.mkdir(parents=True, exist_ok=True)
        import shutil

        shutil.rmtree(where, ignore_errors=True)
        tmp.rename(where)
    return path


def lora_deltas(adapter_dir: Path) -> dict:
    """{HF weight name: float32 [out, in]} = (lora_alpha / r) * B @ A, to add to the base
    weights (a merged model, for checks in HF transformers without peft)."""
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    scaling = cfg["lora_alpha"] / cfg["r"]
    t = read_tensors(Path(adapter_dir) / "adapter_model.safetensors")
    return {a.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight":
            scaling * (t[a.replace(".lora_A.", ".lora_B.")] @ t[a])
            for a in t if a.endswith(".lora_A.weight")}
