"""What the sentinel costs a real vLLM: the same traffic against three fresh servers, one with
the sentinel on (and the attention it weighs for leakage, engines/vllm/attention.py), one with
the sentinel but no weighing, one without, in one run; and, inside the sentinel's server, the
seconds its checks took against the traffic's wall time (the sentinel counts its own time).

The traffic is the probe's shape without its judging: `--sessions` sessions at once, each
`--rounds` rounds of a growing history (token ids, greedy, `--tokens` each), so the checks
see prefix hits, chunked prefills and decode steps.

    python benchmarks/sentinel_overhead.py [--sessions 12] [--rounds 6] [--tokens 16]

Prints: wall seconds with and without, their ratios (the target is at most 1.15), the
sentinel's own seconds as a share of its server's wall time, and what it checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def traffic(base_url: str, model: str, sessions: int, rounds: int, tokens: int,
                  vocab: int) -> None:
    import httpx

    rng = random.Random(0)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def session(k: int) -> None:
            history = [rng.randrange(10, vocab) for _ in range(200 + 37 * k)]
            for _ in range(rounds):
                r = await client.post("/v1/completions", json={
                    "model": model, "prompt": history, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True})
                if r.status_code != 200:
                    raise SystemExit(f"the server answered {r.status_code}: {r.text[:300]}")
                history += [rng.randrange(10, vocab) for _ in range(tokens + rng.randrange(5, 60))]
        await asyncio.gather(*(session(k) for k in range(sessions)))


def timed(sentinel: Path | None, args, weigh: bool = True) -> float:
    import os

    from kvdiag.engines.vllm.launcher import VllmLocal
    from kvdiag.paths import CANARY
    from kvdiag.sentinel.leakage import ENV

    os.environ[ENV] = "1" if weigh else "0"  # the server inherits it
    with VllmLocal(CANARY, num_blocks=args.blocks, max_model_len=2048, sentinel=sentinel,
                   log_path=Path(tempfile.mkdtemp()) / "vllm.log") as server:
        t0 = time.perf_counter()
        vocab = json.loads((CANARY / "config.json").read_text())["vocab_size"]
        asyncio.run(traffic(server.base_url, server.served_model, args.sessions, args.rounds,
                            args.tokens, vocab))
        seconds = time.perf_counter() - t0
        time.sleep(1.0)  # the sentinel's last counters
    return seconds


def main() -> None:
    from kvdiag.sentinel.log import read_report

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--blocks", type=int, default=256)
    args = p.parse_args()
    path = Path(tempfile.mkdtemp()) / "sentinel.jsonl"
    on = timed(path, args)
    bare = timed(Path(tempfile.mkdtemp()) / "bare.jsonl", args, weigh=False)
    off = timed(None, args)
    report = read_report(path)
    c = report.counters
    weighed = all(start.get("attention") for start in report.starts)
    print(f"traffic: {args.sessions} sessions x {args.rounds} rounds, {args.tokens} tokens each")
    print(f"wall seconds: sentinel on {on:.2f} (its checks {bare:.2f} without weighing attention), "
          f"off {off:.2f}; ratio on/off {on / off:.3f} (target <= 1.15), without weighing "
          f"{bare / off:.3f}; attention weighed in the first: {weighed}")
    print(f"the sentinel's own seconds: {c.seconds:.2f} of {on:.2f} ({100 * c.seconds / on:.1f} % "
          "of its server's wall time)")
    print(f"checked: {c.steps} steps, {c.requests} requests, {c.reads} slot reads, {c.writes} writes; "
          f"findings: {c.foreign} foreign, {c.unwritten} unwritten, {c.overwrite} overwrite")


if __name__ == "__main__":
    main()
