"""Planning a sessions file (kvdiag.userdata): time and memory, in one run.

Writes two OpenAI-format files of 10-round conversations, one of `--sessions` conversations
and one ten times longer, then plans `--sessions` x 10 rounds from each with the canary's
tokenizer, as kvdiag.planning.plan wraps it (the suite's case asks for that many sessions; the planner reads no further), and
validates each file whole (kvdiag probe does that before any server starts).

    python benchmarks/sessions_plan.py [--sessions 100]

Prints the planning time (issue 32 asks for under 10 s for 100 x 10), and the peak memory
(tracemalloc) of the plan and of the validating pass for each file: with the file read a
line at a time, the longer file's peaks over the shorter's stay near 1 while its size is 10x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROUNDS = 10


def write_file(path: Path, conversations: int) -> int:
    with path.open("w") as f:
        for c in range(conversations):
            chat = [{"role": "system", "content": f"You are the assistant of desk {c}."}]
            for r in range(ROUNDS):
                chat += [{"role": "user", "content": f"On May {r + 1}, 2024 desk {c} booked ${c % 90}.{r} "
                                                     f"million. What is `total_{r}` now, in round {r}?"},
                         {"role": "assistant", "content": f"Noted: ${c % 90}.{r} million on May {r + 1}, "
                                                          f"2024; total_{r} updated."}]
            f.write(json.dumps({"messages": chat}) + "\n")
    return path.stat().st_size


def peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100)
    args = ap.parse_args()
    from kvdiag.planning.plan import PieceEncoder
    from kvdiag.planning.sessions import plan_sessions_file
    from kvdiag.planning.suites import load_suite
    from kvdiag.userdata.formats import check_file
    from reference_engine.tokenizer import Tokenizer

    canary = Tokenizer.from_dir(ROOT / "fixtures" / "canary")

    def tok():  # as plan_case wraps it, its piece cache empty each time
        return PieceEncoder.wrap(canary)
    base = load_suite("smoke")
    case = dataclasses.replace(base.cases[0], sessions=args.sessions, rounds=ROUNDS)
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small.jsonl", Path(tmp) / "large.jsonl"
        sizes = write_file(small, args.sessions), write_file(large, 10 * args.sessions)
        suite = dataclasses.replace(base, sessions=str(small))
        start = time.perf_counter()
        plan = plan_sessions_file(suite, case, tok())
        seconds = time.perf_counter() - start
        planned = [peak(lambda p=p: plan_sessions_file(dataclasses.replace(base, sessions=str(p)), case, tok()))[1]
                   for p in (small, large)]
        checked = [peak(lambda p=p: check_file(p))[1] for p in (small, large)]
    print(f"planned {plan.user['sessions']} sessions x {plan.case.rounds} rounds "
          f"({sum(map(len, plan.schedule.prompt_lengths))} prompts) in {seconds:.2f} s "
          f"(goal < 10 s: {'met' if seconds < 10 else 'NOT met'})")
    print(f"files: {sizes[0] / 1e6:.2f} MB and {sizes[1] / 1e6:.2f} MB (ratio {sizes[1] / sizes[0]:.1f})")
    print(f"peak memory of the plan: {planned[0] / 1e6:.1f} MB vs {planned[1] / 1e6:.1f} MB "
          f"(ratio {planned[1] / planned[0]:.2f})")
    print(f"peak memory of the validating pass: {checked[0] / 1e6:.2f} MB vs {checked[1] / 1e6:.2f} MB "
          f"(ratio {checked[1] / checked[0]:.2f})")


if __name__ == "__main__":
    main()
