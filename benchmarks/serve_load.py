"""Load: 32 concurrent multi-turn sessions x 12 rounds against `kvdiag serve` (guarded).

Starts the server as a subprocess on loopback (or uses --base-url), drives every session's
rounds as chat requests with the whole history (teacher-forced), and prints requests/s,
prompt and completion tokens/s, failed requests, and the server's own foreign-slot counter.

    python benchmarks/serve_load.py [--sessions 32] [--rounds 12] [--suite smoke|reproduce] [--base-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def drive(url: str, plan, concurrency: int) -> dict:
    import httpx

    failures, prompt_tokens, completion_tokens = [], 0, 0
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def session(k: int):
            nonlocal prompt_tokens, completion_tokens
            for r in range(plan.case.rounds):
                body = {"model": "canary", "messages": plan.sessions[k].messages(r),
                        "max_tokens": plan.case.max_tokens, "temperature": 0}
                async with sem:
                    resp = await client.post("/v1/chat/completions", json=body)
                if resp.status_code != 200:
                    failures.append((k, r, resp.status_code))
                    continue
                usage = resp.json()["usage"]
                prompt_tokens += usage["prompt_tokens"]
                completion_tokens += usage["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(session(k) for k in range(len(plan.sessions))))
        wall = time.perf_counter() - t0
        metrics = (await client.get("/metrics")).text
    foreign = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("kvdiag_foreign_slots_total"))
    n = len(plan.sessions) * plan.case.rounds
    return {"requests": n, "failed": len(failures), "wall_s": wall, "requests_per_s": n / wall,
            "prompt_tokens_per_s": prompt_tokens / wall, "completion_tokens_per_s": completion_tokens / wall,
            "foreign_slots": foreign}


def main() -> int:
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.tokenizer import Tokenizer
    from tests.kvdiag.serving import served

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--base-url")
    ap.add_argument("--suite", default="smoke", help="suite whose trigger case shapes the sessions")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    case = dataclasses.replace(suite.cases[0], sessions=args.sessions, rounds=args.rounds)
    plan = plan_case(suite, case, Tokenizer.from_dir("fixtures/canary"))
    if args.base_url:
        result = asyncio.run(drive(args.base_url, plan, args.sessions))
    else:
        with served("--allocator", "guarded", "--max-num-seqs", str(args.sessions),
                    "--max-model-len", "8704") as (url, _):
            result = asyncio.run(drive(url, plan, args.sessions))
    print(f"{result['requests']} requests ({args.sessions} sessions x {args.rounds} rounds), "
          f"{result['failed']} failed, in {result['wall_s']:.1f} s")
    print(f"requests/s {result['requests_per_s']:.2f}  prompt tokens/s {result['prompt_tokens_per_s']:.0f}  "
          f"completion tokens/s {result['completion_tokens_per_s']:.1f}  foreign slots {result['foreign_slots']:.0f}")
    return 1 if result["failed"] or result["foreign_slots"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
