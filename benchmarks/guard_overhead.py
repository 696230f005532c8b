"""What the SequenceGuard costs: the same sessions through the paged engine with the
`stale-hash` allocator and with `guarded` (SequenceGuard around stale-hash), in one run;
plus what capture mode (attention leakage) costs against plain mode.

Each configuration runs `--repeats` times, interleaved, and the best wall time counts.
Ratios are throughput ratios (guarded / stale-hash, etc.), so 0.99 means a 1 % cost.

On the trigger case the two do different work: stale-hash serves stale blocks instead of
recomputing them. The big-pool case (nothing recycled, so nothing stale) gives the guard's
pure bookkeeping cost on identical work, and guarded vs prefix-cache on the trigger gives
it with recycling.

End-to-end ratios move by a few per cent between repeats on a shared machine, more than the
guard costs. So every run also times the allocator calls inside the engine (the calls the
scheduler and engine make, as benchmarks/allocator_vs_vllm.py does), and the last line gives
the guard's bookkeeping cost on identical work measured that way:
    (whole run with prefix-cache) / (whole run with prefix-cache + extra allocator time of guarded)

    python benchmarks/guard_overhead.py [--suite reproduce] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(checkpoint, plan, allocator: str, capture: bool) -> tuple[float, float]:
    """Wall seconds of the sessions, and seconds spent inside allocator calls."""
    from benchmarks.allocator_vs_vllm import TimedAllocator
    from kvdiag.runners.reference.engine import _engine_config
    from reference_engine.engine import LLMEngine
    from reference_engine.sessions import fixed_prompts, run_sessions

    config = _engine_config(plan, allocator, "cpu", None)
    config = type(config)(**{**config.__dict__, "capture_attention": capture})
    engine = LLMEngine(checkpoint, config)
    engine.allocator = engine.scheduler.allocator = timed = TimedAllocator(engine.allocator)
    t0 = time.perf_counter()
    turns = run_sessions(engine, list(range(len(plan.sessions))), fixed_prompts(plan.prompts),
                         max_tokens=plan.case.max_tokens, think_steps=plan.schedule.think)
    seconds = time.perf_counter() - t0
    assert turns, "no turns ran"
    return seconds, timed.seconds


def main() -> int:
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.loader import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="reproduce")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--identical-only", action="store_true",
                    help="only the identical-work pairs (more repeats in the same time)")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    checkpoint = load_checkpoint(suite.model or "fixtures/canary")
    plans = {name: plan_case(suite, suite.case(name) if name != "big-pool" else _big_pool(suite),
                             checkpoint.tokenizer) for name in ("trigger", "big-pool")}
    configs = [("trigger", "stale-hash", True), ("trigger", "guarded", True),
               ("trigger", "prefix-cache", True), ("big-pool", "stale-hash", True),
               ("big-pool", "guarded", True), ("trigger", "guarded", False)]
    if args.identical_only:
        configs = [("trigger", "guarded", True), ("trigger", "prefix-cache", True),
                   ("big-pool", "stale-hash", True), ("big-pool", "guarded", True)]
    best: dict[tuple, float] = {}
    alloc_s: dict[tuple, float] = {}
    for _ in range(args.repeats):
        for case, alloc, capture in configs:
            seconds, in_alloc = run(checkpoint, plans[case], alloc, capture)
            key = (case, alloc, capture)
            best[key] = min(best.get(key, float("inf")), seconds)
            alloc_s[key] = min(alloc_s.get(key, float("inf")), in_alloc)
    for key, seconds in best.items():
        print(f"{key[0]:9s} {key[1]:13s} capture={'on ' if key[2] else 'off'}  best {seconds:6.2f} s"
              f"   in allocator {alloc_s[key]:6.3f} s ({alloc_s[key] / seconds:5.1%})")

    def ratio(a, b):
        return best[b] / best[a]  # throughput of a relative to b (same requests)

    if not args.identical_only:
        print(f"guarded / stale-hash throughput, trigger (different work): "
              f"{ratio(('trigger', 'guarded', True), ('trigger', 'stale-hash', True)):.3f}")
    print(f"guarded / stale-hash throughput, big-pool (identical work): "
          f"{ratio(('big-pool', 'guarded', True), ('big-pool', 'stale-hash', True)):.3f}")
    print(f"guarded / prefix-cache throughput, trigger (identical work): "
          f"{ratio(('trigger', 'guarded', True), ('trigger', 'prefix-cache', True)):.3f}")
    if not args.identical_only:
        print(f"capture / plain throughput, guarded, trigger: "
              f"{ratio(('trigger', 'guarded', True), ('trigger', 'guarded', False)):.3f}")
    g, p = ("trigger", "guarded", True), ("trigger", "prefix-cache", True)
    extra = alloc_s[g] - alloc_s[p]
    print(f"guard bookkeeping, trigger: guarded spends {extra * 1e3:+.1f} ms more in the allocator "
          f"than prefix-cache ({alloc_s[g] / alloc_s[p]:.2f}x); throughput ratio from it "
          f"{best[p] / (best[p] + extra):.4f}")
    return 0


def _big_pool(suite):
    import dataclasses

    return dataclasses.replace(suite.case("trigger"), name="big-pool", condition="big-pool")


if __name__ == "__main__":
    raise SystemExit(main())
