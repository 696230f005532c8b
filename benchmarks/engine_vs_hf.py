"""Decode throughput of the reference engine and of HF transformers `generate`, on the same
checkpoint (the bundled canary, fp32, CPU), at batch 1 and batch 16, in one run.

Decode throughput = generated tokens / (time to generate N tokens - time to generate 1),
so the prefill is left out for both. Prints tokens/s of each and the ratio ours / HF.

    python benchmarks/engine_vs_hf.py [--model DIR] [--prompt-len 64] [--new 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reference_engine.util import cdiv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="fixtures/canary")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    engine = LLMEngine(args.model, EngineConfig(max_num_seqs=16, max_model_len=args.prompt_len + args.new + 16,
                                                num_blocks=16 * (cdiv(args.prompt_len + args.new + 16, 16))))
    print(f"model {args.model}, prompt {args.prompt_len} tokens, {args.new} new tokens, fp32, "
          f"{torch.get_num_threads()} threads")
    for batch in (1, 16):
        prompts = torch.randint(3, vocab - 10, (batch, args.prompt_len)).tolist()

        def ours(n, prompts=prompts):
            engine.generate(prompts, max_tokens=n, stop_ids=())

        def theirs(n, prompts=prompts, batch=batch):
            with torch.no_grad():
                hf.generate(torch.tensor(prompts), attention_mask=torch.ones(batch, args.prompt_len, dtype=torch.long),
                            max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                            pad_token_id=0)

        ours(2), theirs(2)  # warm up
        t_ours = best(lambda: ours(args.new), args.repeats) - best(lambda: ours(1), args.repeats)
        t_hf = best(lambda: theirs(args.new), args.repeats) - best(lambda: theirs(1), args.repeats)
        tokens = batch * (args.new - 1)
        ours_tps, hf_tps = tokens / t_ours, tokens / t_hf
        print(f"batch {batch:2d}: ours {ours_tps:8.1f} tok/s   HF generate {hf_tps:8.1f} tok/s   "
              f"ratio {ours_tps / hf_tps:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
