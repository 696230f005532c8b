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
(learn_layout). Where that layout is a strided view of the block (strided: AMX's tiles of 16
slots, dims in VNNI pairs), each block's K span is gathered whole and viewed, the pairs moved
as one wider integer; otherwise element by element. All of a step's rows are weighed at once
per layer, padded to the longest and masked (in groups that bound the memory). The weights are held against the kernel's own output (engines/weights.py:
with V from the same slots they must give back what it wrote), so a misread cache turns the
measurement off instead of reporting it. Measured only on vLLM's CPU attention backend, for
plain causal attention (no sliding window, ALiBi, soft cap or sinks); elsewhere the step
carries no vector and the engine core counts a wrong read's token as unweighed, never as 0.
Cost: one extra attention row per request per layer and step, in float32, plus its vector in
the step's output; the worker counts its seconds and hands them on with each step (SECONDS,
the sentinel's counters' `weighing`): 25 % of vLLM's wall time on 2 CPU cores with the canary
(benchmarks/sentinel_overhead.py), which is why it is opt-in (kvdiag.sentinel.leakage.ENV).

    install()   # by kvdiag's vLLM plugin, with the sentinel
"""

from __future__ import annotations

import dataclasses

from kvdiag.engines.weights import Weigher, groups

ATTR = "kvdiag_attention"  # the output's attribute: {request id: float32 array [context]}
SECONDS = "kvdiag_weighing_seconds"  # and the worker's seconds weighing, so far (its cost)
WEIGH = Weigher("vLLM")

_rows: dict[int, list] = {}  # batch row -> [summed weights, layers], for the step running now
_layouts: dict = {}  # (cache shape, dtype, isa) -> (K index, V index, K as a strided view), or None
_WIDER = {2: "int16", 4: "int32", 8: "int64"}  # bytes -> the integer a packed group moves as


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


def _digits(offsets: list[int]) -> list[tuple[int, int]] | None:
    """(size, stride) of each digit of one axis, most significant first, where the axis's
    element x lies at sum(digit_i(x) * stride_i) (x split in mixed radix: AMX tiles of 16
    slots, VNNI pairs of dims); None when no such split gives every offset."""
    n, found, period = len(offsets), [], 1
    while period < n:
        stride, m = offsets[period], 1
        while m * period < n and offsets[m * period] == m * stride:
            m += 1
        if n % (m * period):
            return None
        found.append((m, stride))
        period *= m
    for x in range(n):
        at, rest = 0, x
        for size, stride in found:
            at, rest = at + rest % size * stride, rest // size
        if at != offsets[x]:
            return None
    return found[::-1]


def strided(index, itemsize: int = 2):
    """`index` ([kv_heads, block_size, dim] into a block, from learn_layout) as a strided view
    over the span it covers: (start, span, sizes, strides, pack), or None where it is no such
    view. Gathering a span (a few contiguous KB a block) and viewing it costs a fraction of an
    element-by-element gather. `pack` > 1: the innermost `pack` dims lie side by side (VNNI
    pairs), so the view moves them as one wider integer (`itemsize` bytes each), not apart."""
    start, base = int(index.min()), int(index[0, 0, 0])
    if base != start:
        return None
    axes = [(index[:, 0, 0] - base).tolist(), (index[0, :, 0] - base).tolist(),
            (index[0, 0, :] - base).tolist()]
    split = [_digits(a) for a in axes]
    if None in split:
        return None
    import torch

    h, s, d = (torch.tensor(a) for a in axes)
    if not torch.equal(index - base, h[:, None, None] + s[None, :, None] + d[None, None, :]):
        return None
    digits = [x for axis in split for x in axis]
    span = int(index.max()) - start + 1
    pack = digits[-1][0] if split[2] and digits[-1][1] == 1 else 1
    if pack > 1 and (pack * itemsize not in _WIDER or span % pack or any(x[1] % pack for x in digits[:-1])):
        pack = 1
    return start, span, [x[0] for x in digits], [x[1] for x in digits], pack


def _keys(flat, layout, ids, kv_heads, block_size, dim):
    """The K of blocks `ids` [rows, n], as the rows' contexts [rows, kv_heads, n * block_size, dim]."""
    import torch

    rows, n = ids.shape
    k_index, _, view = layout
    if view is not None:  # each block's K span, contiguous, then viewed in its layout
        start, span, sizes, strides, pack = view
        got = flat[:, start:start + span].index_select(0, ids.reshape(-1))
        if pack > 1:
            got, sizes, strides = (got.view(getattr(torch, _WIDER[pack * got.element_size()])),
                                   sizes[:-1], [x // pack for x in strides[:-1]])
        k = got.as_strided((rows * n, *sizes), (span // pack, *strides)).reshape(rows * n, -1)
        k = k.view(flat.dtype).reshape(rows, n, kv_heads, block_size, dim)
    else:
        k = flat[ids[:, :, None, None, None], k_index]
    return k.permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, n * block_size, dim)


def _measure(impl, layer, query, kv_cache, meta, output, write) -> None:
    """Add this layer's attention of each row's last query token to `_rows` (weighed and held
    against the kernel's output by WEIGH). `write`: vLLM's cache write op, for its layout."""
    if impl.sliding_window not in (None, -1, (-1, -1)) or impl.alibi_slopes is not None \
            or impl.logits_soft_cap or getattr(impl, "sinks", None) is not None:
        return
    blocks, kv_heads, block_size, _ = kv_cache.shape
    key = (tuple(kv_cache.shape[1:]), kv_cache.dtype, getattr(layer, "isa", None))
    if key not in _layouts:
        learned = learn_layout(kv_cache, write)
        _layouts[key] = learned and (*learned, strided(learned[0], kv_cache.element_size()))
    if _layouts[key] is None:
        WEIGH.stop("vLLM's cache write placed K/V in no layout this code can read")
        return
    layout = _layouts[key]
    heads, dim = impl.num_heads, impl.head_size
    q = query[:meta.num_actual_tokens].reshape(-1, heads, dim)
    out = output[:meta.num_actual_tokens].reshape(len(q), heads, -1)
    starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    rows = [(b, starts[b + 1] - 1, n) for b, n in enumerate(lens) if n > 0 and starts[b + 1] > starts[b]]
    flat = kv_cache.reshape(blocks, -1)
    for group in groups([n for *_, n in rows], kv_heads * dim):
        chosen = [rows[i] for i in group]
        n = -(-max(length for *_, length in chosen) // block_size)
        ids = meta.block_table[[b for b, *_ in chosen], :n].long().clamp(0, blocks - 1)
        lasts = [last for _, last, _ in chosen]

        values = []  # the V of the rows the weigher still checks, element by element
        for _, _, length in chosen[:WEIGH.left(len(chosen))]:
            table = ids[len(values), :-(-length // block_size)][:, None, None, None]
            v = flat[table, layout[1]].permute(1, 0, 2, 3).reshape(kv_heads, -1, dim)
            values.append(v[:, :length])
        w = WEIGH(q[lasts], _keys(flat, layout, ids, kv_heads, block_size, dim),
                  [length for *_, length in chosen], impl.scale, out[lasts], values)
        if w is None:
            return
        for i, (b, _, length) in enumerate(chosen):
            row = _rows.get(b)
            if row is None or len(row[0]) != length:
                _rows[b] = [w[i, :length].clone(), 1]
            else:
                row[0] += w[i, :length]
                row[1] += 1


def _attach(runner, out):
    """The step's output with the vectors, by request id, and the seconds spent weighing so far
    (a copy: vLLM reuses its empty output)."""
    if out is None or not hasattr(out, "req_ids") or not out.req_ids:
        return out
    ids = runner.input_batch.req_ids
    vectors = {} if WEIGH.off else {ids[b]: (w / layers).numpy() for b, (w, layers) in _rows.items()
                                    if b < len(ids)}
    _rows.clear()
    out = dataclasses.replace(out)
    setattr(out, ATTR, vectors)
    setattr(out, SECONDS, WEIGH.seconds)
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

            with WEIGH.timed():
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
