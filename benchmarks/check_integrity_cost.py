"""What EngineConfig.check_integrity (KVDIAG_CHECK_INTEGRITY=1) costs: the paged engine on the
reproduce suite's default case (trigger: 16 sessions x 12 rounds, 4095 -> 4112, canary
model), with the allocator's check_integrity() after every scheduling step and without,
in one run; prints both wall times and their ratio (goal: close to 1).

The contiguous reference is not timed (the check does not apply to it); prompts are the
case's, teacher-forced. `--sessions/--rounds` shrink the case (same trigger, fewer of each)
for a quick figure. The stale-hash allocator is not timed: with the check on it raises at
its first stale entry, which is the point.

    .venv/bin/python benchmarks/check_integrity_cost.py [--allocator guarded] [--sessions 4 --rounds 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_once(plan, checkpoint, allocator: str, check: bool) -> tuple[float, int, float]:
    """Wall seconds of the run, engine steps, and seconds spent inside check_integrity()."""
    from kvdiag.runners.reference.engine import _engine_config
    from reference_engine.engine import LLMEngine
    from reference_engine.sessions import fixed_prompts, run_sessions

    config = dataclasses.replace(_engine_config(plan, allocator, "cpu", None), check_integrity=check)
    engine = LLMEngine(checkpoint, config)
    inner, in_check = engine.allocator.check_integrity, [0.0]

    def timed_check():
        t = time.perf_counter()
        inner()
        in_check[0] += time.perf_counter() - t

    engine.allocator.check_integrity = timed_check
    steps = [0]
    t0 = time.perf_counter()
    run_sessions(engine, list(range(len(plan.sessions))), fixed_prompts(plan.prompts),
                 max_tokens=plan.case.max_tokens, think_steps=plan.schedule.think,
                 on_step=lambda: steps.__setitem__(0, steps[0] + 1))
    return time.perf_counter() - t0, steps[0], in_check[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocator", default="guarded")
    ap.add_argument("--sessions", type=int, default=None, help="default: the case's (16)")
    ap.add_argument("--rounds", type=int, default=None, help="default: the case's (12)")
    args = ap.parse_args()

    from kvdiag.paths import CANARY
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.loader import load_checkpoint

    suite = load_suite("reproduce")
    case = suite.select(None)[0]
    changes = {k: v for k, v in (("sessions", args.sessions), ("rounds", args.rounds)) if v}
    case = dataclasses.replace(case, **changes)
    checkpoint = load_checkpoint(CANARY)
    plan = plan_case(suite, case, checkpoint.tokenizer)
    print(f"{os.cpu_count()} CPUs; load average before: "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"case {case.name}: {case.sessions} sessions x {case.rounds} rounds, "
          f"pool {plan.schedule.num_blocks} blocks, allocator {args.allocator}")
    off, steps, _ = run_once(plan, checkpoint, args.allocator, check=False)
    on, steps_on, in_check = run_once(plan, checkpoint, args.allocator, check=True)
    assert steps == steps_on  # the check changes nothing the engine does
    print(f"check off: {off:.1f} s   check on: {on:.1f} s   ({steps} steps; inside the check "
          f"{in_check:.2f} s, {1000 * in_check / steps:.2f} ms per step)")
    print(f"ratio on/off (wall): {on / off:.3f}   check time / run time (same run): "
          f"{in_check / on:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
