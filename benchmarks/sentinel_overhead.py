"""What the sentinel costs a real vLLM: the same traffic against three fresh servers, one with
the sentinel on (and the attention it weighs for leakage, engines/vllm/attention.py), one with
the sentinel but no weighing, one without, in one run; and, inside the sentinel's server, the
seconds its checks took against the traffic's wall time (the sentinel counts its own time).

The traffic is the probe's shape without its judging: `--sessions` sessions at once, each
`--rounds` rounds of a growing history (token ids, greedy, `--tokens` each), so the checks
see prefix hits, chunked prefills and decode steps.

    python benchmarks/sentinel_overhead.py [--sessions 12] [--rounds 6] [--tokens 16] [--repeat 3]

Each server, one at a time, gets one warm-up run of the traffic, then `--repeat` runs; its
median counts. The pool (`--blocks`, 1024 by default) holds the traffic whole, so no run
preempts: preemption makes a run's time depend on its order of arrival, not on the sentinel.

Prints: wall seconds with and without, their ratios (the target is at most 1.15), the
sentinel's own seconds and the worker's seconds weighing attention as shares of the same
server's wall time (counted inside it, so a slower spell of a shared machine, which moves
one server's wall time against another's, does not move them), and what it checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def traffic(base_url: str, model: str, sessions: int, rounds: int, tokens: int,
                  vocab: int, seed: int = 0) -> None:
    import httpx

    rng = random.Random(seed)
    # idle connections dropped before the server's keep-alive (uvicorn: 5 s) can close one under us
    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(keepalive_expiry=2.0)) as client:
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


def timed(sentinel: Path | None, args, weigh: bool = True) -> tuple[float, float]:
    """One fresh server: the median wall seconds of `--repeat` runs of the traffic (each its
    own prompts, so no run hits another's prefixes) after one warm-up run, not counted; and the
    seconds of every run, the warm-up's included (what the sentinel's own time is of). One
    server at a time: vLLM's idle CPU servers beside a busy one slowed it unevenly here."""
    import os

    from kvdiag.engines.vllm.launcher import VllmLocal
    from kvdiag.paths import CANARY
    from kvdiag.sentinel.leakage import ENV

    os.environ[ENV] = "1" if weigh else "0"  # the server inherits it
    vocab = json.loads((CANARY / "config.json").read_text())["vocab_size"]
    seconds = []
    with VllmLocal(CANARY, num_blocks=args.blocks, max_model_len=2048, sentinel=sentinel,
                   log_path=Path(tempfile.mkdtemp()) / "vllm.log") as server:
        for seed in range(args.repeat + 1):
            t0 = time.perf_counter()
            asyncio.run(traffic(server.base_url, server.served_model, args.sessions, args.rounds,
                                args.tokens, vocab, seed))
            seconds.append(time.perf_counter() - t0)
        time.sleep(1.0)  # the sentinel's last counters
    name = "off" if sentinel is None else "on" if weigh else "bare"
    print(f"{name:>5}: " + " ".join(f"{x:.2f}" for x in seconds) + " s (the first: the warm-up)")
    return statistics.median(seconds[1:]), sum(seconds)


def main() -> None:
    from kvdiag.sentinel.log import read_report

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--blocks", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3, help="runs of the traffic per server, after a "
                   "warm-up run; the median counts (default 3)")
    args = p.parse_args()
    path = Path(tempfile.mkdtemp()) / "sentinel.jsonl"
    on, on_all = timed(path, args)
    bare, _ = timed(Path(tempfile.mkdtemp()) / "bare.jsonl", args, weigh=False)
    off, _ = timed(None, args)
    report = read_report(path)
    c = report.counters
    weighed = all(start.get("attention") for start in report.starts)
    print(f"traffic: {args.sessions} sessions x {args.rounds} rounds, {args.tokens} tokens each; "
          f"median of {args.repeat} runs per server after a warm-up; {args.blocks} blocks")
    print(f"wall seconds: sentinel on {on:.2f} (its checks {bare:.2f} without weighing attention), "
          f"off {off:.2f}; ratio on/off {on / off:.3f} (target <= 1.15), without weighing "
          f"{bare / off:.3f}; attention weighed in the first: {weighed}")
    print(f"the sentinel's own seconds: {c.seconds:.2f} of {on_all:.2f} ({100 * c.seconds / on_all:.1f} % "
          "of its server's wall time over every run)")
    print(f"weighing attention, in vLLM's worker: {c.weighing:.2f} s of the same {on_all:.2f} "
          f"({100 * c.weighing / on_all:.1f} %; the server's time without it, by that count, "
          f"{on_all - c.weighing:.2f} s: ratio {on_all / max(on_all - c.weighing, 1e-9):.3f})")
    print(f"checked: {c.steps} steps, {c.requests} requests, {c.reads} slot reads, {c.writes} writes; "
          f"findings: {c.foreign} foreign, {c.unwritten} unwritten, {c.overwrite} overwrite")


if __name__ == "__main__":
    main()
