"""A LoRA adapter for a llama-architecture GGUF model (SmolLM2's), made here from the model's
own weights, that answers as the base model does but writes other keys: so K/V computed under
it and read by a base request (or the reverse) is wrong, and a cache that keys its entries by
tokens only serves it anyway. llama.cpp's #26207 is that class: an adapter's K/V reused for
another adapter or for the base model.

Construction (the canary's adapter, kvdiag.canary.lora, does the same for vLLM): in every
layer, the keys of KV head 0 and the queries of the query heads that read it have their
`PAIRS` lowest-frequency RoPE pairs negated,

    q' = S q,  k' = S k,   S = diag(-1 on both dims of each chosen pair, +1 elsewhere)

llama.cpp rotates adjacent dims (2i, 2i + 1) as one pair (the GGUF converter permutes Q and K
so), and a pair negated whole commutes with its rotation: within one model q'.k' = q.k at
every offset, so the adapter's answers are the base model's up to numerics (its LoRA term is
computed apart from the quantized weights). Across models the chosen pairs' share of every
score of heads 0-2 changes sign. A sign flip of the rows R of W is W' = W - 2 P_R W: rank |R|,
written as B @ A with A = W[R] (dequantized, [r, n_embd]) and B = -2 at (R[j], j) ([out, r]),
alpha = r (scale 1). The file is built once per model into kvdiag's cache and served with

    llama-server -m MODEL --lora-scaled FILE:0

(a request then asks for it with "lora": [{"id": 0, "scale": 1}]; one without the field runs
the server's list as loaded, here the base model)."""

from __future__ import annotations

from pathlib import Path

from kvdiag.errors import KvdiagError

NAME = "kvdiag-lora"  # the adapter's name in kvdiag (--adapter), its file's stem
PAIRS = 8  # RoPE pairs negated per head: the lowest-frequency ones


def _rows(head: int, head_dim: int) -> list[int]:
    """The rows of head `head` holding its PAIRS lowest-frequency pairs (the last dims)."""
    first = head * head_dim + head_dim - 2 * PAIRS
    return list(range(first, head * head_dim + head_dim))


def _flip(w, rows: list[int]):
    """(A, B) of the rank-len(rows) update that negates `rows` of `w` ([out, in])."""
    import numpy as np

    a = np.ascontiguousarray(w[rows], dtype=np.float32)
    b = np.zeros((w.shape[0], len(rows)), dtype=np.float32)
    b[rows, range(len(rows))] = -2.0
    return a, b


def build(model: Path, out: Path) -> Path:
    """Write the adapter for `model` (a GGUF) to `out`. KvdiagError for a model that is not
    of the llama architecture or whose attention shapes do not fit."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(model)

    def field(key: str):
        f = reader.fields.get(key)
        if f is None:
            raise KvdiagError(f"{model}: no {key} in its metadata")
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else int(value[0])

    arch = field("general.architecture")
    if arch != "llama":
        raise KvdiagError(f"{model}: a {arch} model; kvdiag makes adapters for llama-architecture GGUFs")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    head_dim = field("llama.embedding_length") // heads
    if head_dim < 2 * PAIRS or heads % kv_heads:
        raise KvdiagError(f"{model}: {heads} heads of {head_dim} dims over {kv_heads} KV heads do not fit")
    k_rows = _rows(0, head_dim)
    q_rows = [r for h in range(heads // kv_heads) for r in _rows(h, head_dim)]  # the heads KV head 0 serves
    tensors = {t.name: t for t in reader.tensors}
    writer = gguf.GGUFWriter(out, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 1.0)  # per tensor scale alpha / rank: set below
    for layer in range(field("llama.block_count")):
        for kind, rows in (("attn_k", k_rows), ("attn_q", q_rows)):
            t = tensors[f"blk.{layer}.{kind}.weight"]
            w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
            a, b = _flip(w, rows)
            # llama.cpp scales B @ A by alpha / rank: alpha 1 with B times rank is scale 1
            writer.add_tensor(f"blk.{layer}.{kind}.weight.lora_a", a)
            writer.add_tensor(f"blk.{layer}.{kind}.weight.lora_b", np.ascontiguousarray(b * len(rows)))
    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def ensure_adapter(model: Path) -> Path:
    """The adapter for `model`, built once into kvdiag's cache (keyed by the model's bytes)."""
    from kvdiag.models.gguf_import import file_sha256
    from kvdiag.paths import cache_root

    out = cache_root() / "llamacpp-lora" / file_sha256(model)[:16] / f"{NAME}.gguf"
    if not out.is_file():
        partial = out.with_suffix(".partial")
        build(model, partial)
        partial.replace(out)
    return out
