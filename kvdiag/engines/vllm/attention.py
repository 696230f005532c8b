"""Attention leakage inside live vLLM: how much attention each sampled token paid to the
slots the sentinel found read wrong, the reference engine's `attention_leakage` (kvdiag's seed
metric) measured in a real engine. Installed with the sentinel, in every vLLM process; it
acts in the worker, where the forward pass runs (on CPU vLLM runs it in a process of its own).

The worker cannot know which slots are wrong: the sentinel finds that in the engine core,
after the step. So the worker measures, for each request of the step, the attention its last
query token (the one that samples) paid to every position of its context, averaged over the
layers and heads, and hands that vector to the engine core with the step's output:

    forward of layer l   p_l[b] = softmax(q_last[b] . K[b, 0:L]^T * scale)   [heads, L]
    after the forward    w[b] = mean over layers and heads of p_l[b]          [L]
    engine core          leakage of the token = sum of w[b] over the positions it read wrong

A sum over positions commutes with the mean over layers and heads, so this is exactly the
reference engine's per-token leakage (reference_engine/paged_backend.py). Its max over layers
and heads is not: the live engines' `attention_leakage_max` stays unmeasured.

K is read back from vLLM's own cache after the layer ran (post-RoPE, as the kernel read it),
through the step's block table: the same slots the sentinel judged. vLLM's CPU kernels pack a
block for their ISA, so where each element lies is learned once from vLLM's own write op
(learn_layout). The weights are held against the kernel's own output (engines/weights.py:
with V from the same slots they must give back what it wrote), so a misread cache turns the
measurement off instead of reporting it. Measured only on vLLM's CPU attention backend, for
plain causal attention (no sliding window, ALiBi, soft cap or sinks); elsewhere the step
carries no vector and the engine core counts a wrong read's token as unweighed, never as 0.
Cost: one extra attention row per request per layer and step, in float32, plus its vector in
the step's output: 2.8 times vLLM's wall time on 2 CPU cores with the canary
(benchmarks/sentinel_overhead.py), which is why it is opt-in (kvdiag.sentinel.leakage.ENV).

    install()   # by kvdiag's vLLM plugin, with the sentinel
"""

from __future__ import annotations

import dataclasses

from kvdiag.engines.weights import Weigher

ATTR = "kvdiag_attention"  # the output's attribute: {request id: float32 array [context]}
WEIGH = Weigher("vLLM")

_rows: dict[int, list] = {}  # batch row -> [summed weights, layers], for the step running now
_layouts: dict = {}  # (cache shape, dtype, isa) -> (K index, V index) into a block, or None


def learn_layout(kv_cache, write):
    """Where vLLM's CPU kernels keep each K and V element of a block: they pack blocks for
    their ISA (AMX tiles, VNNI pairs), which no view of the tensor undoes. So the layout is
    learned from vLLM's own write op (`write(key, value, key_cache, value_cache, slots)`,
    ops.cpu_attn_reshape_and_cache), run on a scratch block: element codes written in four
    passes (K or V, slot, head, dim; small integers, exact in bf16) and read back. Returns two
    index tensors [kv_heads, block_size, dim] into a block's flat storage, or None when the
    write is not a one-to-one placement."""
    import torch

    _, kv_heads, block_size, twice = kv_cache.shape
    dim = twice // 2
    scratch = torch.full((1, kv_heads, block_size, twice), -1.0, dtype=kv_cache.dtype)
    shape = (block_size, kv_heads, dim)
    codes = []
    for key, value in ((torch.ones(shape), torch.full(shape, 2.0)),
                       *((torch.arange(n).reshape(view).expand(shape).float(),) * 2
                         for n, view in ((block_size, (-1, 1, 1)), (kv_heads, (1, -1, 1)),
                                         (dim, (1, 1, -1))))):
        view = scratch.view(1, kv_heads, block_size * 2, dim)
        write(key.to(kv_cache.dtype), value.to(kv_cache.dtype), *view.chunk(2, dim=2),
              torch.arange(block_size))
        codes.append(scratch.reshape(-1).float().round().long())
    which, slot, head, d = codes
    index = []
    for half in (1, 2):
        at = torch.nonzero(which == half).squeeze(1)
        flat = (head[at] * block_size + slot[at]) * dim + d[at]
        if len(at) != kv_heads * block_size * dim or len(torch.unique(flat)) != len(at):
            return None
        placed = torch.empty(len(at), dtype=torch.long)
        placed[flat] = at
        index.append(placed.reshape(kv_heads, block_size, dim))
    return tuple(index)


def _measure(impl, layer, query, kv_cache, meta, output, write) -> None:
    """Add this layer's attention of each row's last query token to `_rows` (weighed and held
    against the kernel's output by WEIGH). `write`: vLLM's cache write op, for its layout."""
    if impl.sliding_window not in (None, -1, (-1, -1)) or impl.alibi_slopes is not None \
            or impl.logits_soft_cap or getattr(impl, "sinks", None) is not None:
        return
    blocks, kv_heads, block_size, _ = kv_cache.shape
    key = (tuple(kv_cache.shape[1:]), kv_cache.dtype, getattr(layer, "isa", None))
    if key not in _layouts:
        _layouts[key] = learn_layout(kv_cache, write)
    if _layouts[key] is None:
        WEIGH.stop("vLLM's cache write placed K/V in no layout this code can read")
        return
    k_index, v_index = _layouts[key]
    heads, dim = impl.num_heads, impl.head_size
    q = query[:meta.num_actual_tokens].reshape(-1, heads, dim)
    out = output[:meta.num_actual_tokens].reshape(len(q), heads, -1)
    starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    flat = kv_cache.reshape(blocks, -1)
    for b, length in enumerate(lens):
        last = starts[b + 1] - 1
        if last < starts[b] or length <= 0:
            continue
        n = -(-length // block_size)
        table = meta.block_table[b, :n].long()[:, None, None, None]

        def context(index):  # only the elements asked for, gathered once -> [kv_heads, length, dim]
            return flat[table, index].permute(1, 0, 2, 3).reshape(kv_heads, n * block_size, -1)[:, :length]

        w = WEIGH(q[last], context(k_index), context(v_index) if WEIGH.checking else None,
                  impl.scale, out[last])
        if w is None:
            return
        row = _rows.get(b)
        if row is None or len(row[0]) != length:
            _rows[b] = [w, 1]
        else:
            row[0] += w
            row[1] += 1


def _attach(runner, out):
    """The step's output with the vectors, by request id (a copy: vLLM reuses its empty output)."""
    if out is None or not hasattr(out, "req_ids") or not out.req_ids:
        return out
    ids = runner.input_batch.req_ids
    vectors = {} if WEIGH.off else {ids[b]: (w / layers).numpy() for b, (w, layers) in _rows.items()
                                    if b < len(ids)}
    _rows.clear()
    out = dataclasses.replace(out)
    setattr(out, ATTR, vectors)
    return out


def install():
    """Measure in this process's CPU attention backend and hand the vectors on with each
    step's output (a process that runs no forward pass is left as it was); returns undo()."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from kvdiag.engines.patching import both, swap_attr

    forward = CPUAttentionBackendImpl.forward
    execute, sample = GPUModelRunner.execute_model, GPUModelRunner.sample_tokens

    def forward_measured(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        out = forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        written = kwargs.get("output", args[0] if args else None)
        if attn_metadata is not None and written is not None and kv_cache.numel() \
                and getattr(self, "attn_type", "decoder") == "decoder" \
                and getattr(attn_metadata, "causal", True):
            def write(k, v, key_cache, value_cache, slots):  # as do_kv_cache_update writes
                ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, layer.isa,
                                               k_scale=1.0, v_scale=1.0,
                                               kv_cache_dtype=self.kv_cache_dtype)

            _measure(self, layer, query, kv_cache, attn_metadata, written, write)
        return out

    def execute_measured(self, scheduler_output, *args, **kwargs):
        _rows.clear()
        return _attach(self, execute(self, scheduler_output, *args, **kwargs))

    def sample_measured(self, *args, **kwargs):
        return _attach(self, sample(self, *args, **kwargs))

    return both(swap_attr(CPUAttentionBackendImpl, "forward", forward_measured),
                swap_attr(GPUModelRunner, "execute_model", execute_measured),
                swap_attr(GPUModelRunner, "sample_tokens", sample_measured))
