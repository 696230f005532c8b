"""Attention leakage inside live SGLang (the reference engine's `attention_leakage`): what each
sampled token's attention paid to the slots the sentinel found read wrong. Installed with the
sentinel, in SGLang's scheduler process, where its model runs.

SGLang's torch-native attention (the CPU backend) is wrapped: after a layer ran, the last
query token of each request in the batch (the one that samples) is weighed again over the
context its row of req_to_token maps, from the layer's own K buffer (post-RoPE, as read), and
its weights are averaged over heads and summed over layers, keyed by the request's row and
length, once they give back with the layer's V what the backend wrote for that token
(engines/weights.py). The sentinel (sentinel.py) takes them when it checks the batch, divides
by the layers, and sums them over the positions the ledger found read wrong
(kvdiag.sentinel.leakage), exactly as engines/vllm/attention.py does for vLLM. Another backend, or a sliding window, is not
weighed: those tokens count as unmeasured, never as 0.

    install()   # by kvdiag's SGLang plugin, with the sentinel
"""

from __future__ import annotations

from collections import OrderedDict

from kvdiag.engines.weights import Weigher, groups

WEIGH = Weigher("SGLang")
KEEP = 4096  # rows kept for batches not yet checked (overlap scheduling runs one ahead)

weights: OrderedDict = OrderedDict()  # (req_pool_idx, seq_len) -> [summed weights, layers]


def take(pool_idx: int, length: int):
    """The weights of the request on row `pool_idx` at context `length`, averaged over the
    layers (numpy), or None where none were measured."""
    got = weights.pop((pool_idx, length), None)
    return None if got is None or WEIGH.off else (got[0] / got[1]).numpy()


def _measure(q, out, k_cache, v_cache, req_to_token, pool, seq_lens, last_rows, scaling) -> None:
    rows = [(idx, length, last_rows[b]) for b, (idx, length) in enumerate(zip(pool.tolist(), seq_lens.tolist()))
            if length > 0]
    kv_heads, dim = k_cache.shape[1:]
    for group in groups([length for _, length, _ in rows], kv_heads * dim):
        chosen = [rows[i] for i in group]
        slots = req_to_token[[idx for idx, _, _ in chosen], :max(n for _, n, _ in chosen)].long()
        slots = slots.clamp(0, len(k_cache) - 1)  # past a row's length: read, then masked
        lasts = [last for *_, last in chosen]
        values = [v_cache[slots[i, :chosen[i][1]]].transpose(0, 1) for i in range(WEIGH.left(len(chosen)))]
        w = WEIGH(q[lasts], k_cache[slots].permute(0, 2, 1, 3), [n for _, n, _ in chosen], scaling,
                  out[lasts], values)
        if w is None:
            return
        for i, (idx, length, _) in enumerate(chosen):
            got = weights.get((idx, length))
            if got is None:
                weights[(idx, length)] = [w[i, :length].clone(), 1]
            else:
                got[0] += w[i, :length]
                got[1] += 1
    while len(weights) > KEEP:
        weights.popitem(last=False)


def install():
    """Weigh in this process's torch-native attention backend; returns undo()."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from kvdiag.engines.patching import both, swap_attr

    extend, decode = (TorchNativeAttnBackend._run_sdpa_forward_extend,
                      TorchNativeAttnBackend._run_sdpa_forward_decode)

    def plain(kwargs) -> bool:
        return (not kwargs.get("is_cross_attn") and kwargs.get("sliding_window_size") is None
                and kwargs.get("scaling") is not None)

    def extend_weighed(self, query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                       prefix_lens, extend_lens, *args, **kwargs):
        out = extend(self, query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                     prefix_lens, extend_lens, *args, **kwargs)
        if plain(kwargs) and kwargs.get("causal", True):
            with WEIGH.timed():
                _measure(query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                         (torch.cumsum(extend_lens, 0) - 1).tolist(), kwargs["scaling"])
        return out

    def decode_weighed(self, query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                       *args, **kwargs):
        out = decode(self, query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                     *args, **kwargs)
        if plain(kwargs):
            with WEIGH.timed():
                _measure(query, output, k_cache, v_cache, req_to_token, pool, seq_lens,
                         list(range(len(seq_lens))), kwargs["scaling"])
        return out

    return both(swap_attr(TorchNativeAttnBackend, "_run_sdpa_forward_extend", extend_weighed),
                swap_attr(TorchNativeAttnBackend, "_run_sdpa_forward_decode", decode_weighed))
