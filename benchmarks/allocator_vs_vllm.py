"""Our prefix-cache allocator against vLLM's block manager on the same trace, in one run.

Both replay the same trace model-free (kvdiag.runners.replay.drive / vllm_replay) with the shadow
map and invariant checks off, so what is timed is the block manager: for ours, every call
the scheduler makes on the allocator (lookup, can_allocate, allocate, append_block,
cache_full_blocks, free), hashing included; for vLLM, get_computed_blocks, allocate_slots,
free, the prefix-cache statistics, Request construction and append_output_token_ids (where
vLLM hashes blocks). An operation is one token slot of the trace (prompt + output tokens),
the same count for both, so ops/s are comparable and the ratio is ours / vLLM's (goal >= 1).

    .venv-vllm/bin/python benchmarks/allocator_vs_vllm.py [--trace FILE] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TIMED = ("lookup", "can_allocate", "allocate", "append_block", "cache_full_blocks", "free")


class TimedAllocator:
    """Forwards everything to the allocator; times the calls the scheduler makes."""

    def __init__(self, inner) -> None:
        self._inner, self.seconds, self.calls = inner, 0.0, 0
        for name in TIMED:
            setattr(self, name, self._timed(getattr(inner, name)))

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        return call

    def __getattr__(self, name):
        return getattr(self._inner, name)


def trigger_trace():
    """The trigger schedule of tests/reference_engine/test_faults.py, random token ids."""
    from kvdiag.planning.scenarios import make_schedule
    from kvdiag.runners.replay.trace import from_schedule

    rng = random.Random(1)
    answers = [[14 if r % 4 == 3 else rng.choice([2, 3, 4]) for r in range(12)] for _ in range(16)]
    return from_schedule(make_schedule("trigger", answers, min_user=6))


def run_ours(trace, name: str) -> tuple[float, float, int]:
    from kvdiag.runners.replay.drive import AllocatorReplay, drive
    from reference_engine import allocators

    cfg = trace.config
    timed = TimedAllocator(allocators.create(name, cfg.num_blocks, cfg.block_size,
                                             cfg.enable_prefix_caching))
    engine = AllocatorReplay(trace, timed, check=False)
    t0 = time.perf_counter()
    drive(trace, engine)
    return timed.seconds, time.perf_counter() - t0, engine.num_steps


def run_vllm(trace, api) -> tuple[float, float, int]:
    from kvdiag.runners.replay.drive import drive
    from kvdiag.runners.replay.vllm import VllmReplay

    engine = VllmReplay(trace, api, check=False)
    t0 = time.perf_counter()
    drive(trace, engine)
    return engine.manager_seconds, time.perf_counter() - t0, engine.num_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="a recorded trace (default: the synthetic "
                        "trigger trace)")
    parser.add_argument("--allocator", default="prefix-cache")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is kept")
    args = parser.parse_args()

    from kvdiag.runners.replay.trace import read_trace
    from kvdiag.runners.replay.vllm_api import load

    trace = read_trace(args.trace) if args.trace else trigger_trace()
    api = load()
    ops = trace.num_operations
    ours, theirs = [], []
    for _ in range(args.repeat):  # interleaved, so drift in machine load hits both
        ours.append(run_ours(trace, args.allocator))
        theirs.append(run_vllm(trace, api))
    (o_mgr, o_all, o_steps), (v_mgr, v_all, v_steps) = min(ours), min(theirs)
    print(f"trace: {trace.config.suite}/{trace.config.case}, {len(trace.requests)} requests, "
          f"{ops} token operations, pool {trace.config.num_blocks} blocks of {trace.config.block_size}")
    print(f"{'':28} {'block manager':>16} {'whole replay':>16} {'steps':>6}")
    print(f"{'ours (' + args.allocator + ')':28} {ops / o_mgr:>12,.0f} op/s {ops / o_all:>12,.0f} op/s {o_steps:>6}")
    print(f"{api.label:28} {ops / v_mgr:>12,.0f} op/s {ops / v_all:>12,.0f} op/s {v_steps:>6}")
    print(f"ratio ours / vLLM (block manager): {v_mgr / o_mgr:.2f}  (goal >= 1.0; whole replay "
          f"{v_all / o_all:.2f}; best of {args.repeat})")


if __name__ == "__main__":
    main()
