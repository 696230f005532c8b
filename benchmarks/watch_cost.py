"""What kvdiag watch costs a client: the same chat traffic (kvdiag.watch.clients, all
streaming) straight to a `kvdiag serve` and through `kvdiag watch` in front of it, in one run,
alternating, several times. Prints p50 and p99 request latency and throughput, proxy over
direct, and the twins' extra load on the upstream as a share of its prompt tokens.

    python benchmarks/watch_cost.py [--clients 64] [--rounds 3] [--repeats 3] [--sample 0.01]

Targets (issue 39): p50 <= 1.05x, throughput >= 0.95x."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvdiag.watch.clients import run_clients  # noqa: E402
from tests.kvdiag.serving import served, watching  # noqa: E402


def _once(url: str, args) -> tuple[list[float], float]:
    start = time.perf_counter()
    traffic = asyncio.run(run_clients(url, "canary", clients=args.clients, rounds=args.rounds,
                                      stream_share=1.0, document_words=60, max_tokens=16,
                                      seed=args.seed, quote_share=0))
    wall = time.perf_counter() - start
    assert traffic.failed == 0, traffic
    return traffic.latencies, traffic.requests / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    serve = ("--num-blocks", "4096", "--max-num-seqs", "64", "--max-model-len", "2048")
    with served(*serve) as (upstream, _), TemporaryDirectory() as tmp, \
            watching(upstream, "--file", f"{tmp}/w.jsonl", "--sample", str(args.sample),
                     "--warmup", "0") as url:
        direct, through, rate_d, rate_p = [], [], [], []
        _once(upstream, args)  # warm both paths' caches and connections
        for _ in range(args.repeats):
            lat, rate = _once(upstream, args)
            direct += lat
            rate_d.append(rate)
            lat, rate = _once(url, args)
            through += lat
            rate_p.append(rate)
        status = httpx.get(url + "/kvdiag/status", timeout=10).json()
        metrics = httpx.get(upstream + "/metrics", timeout=10).text

    def q(xs, p):
        return statistics.quantiles(xs, n=100)[p - 1]

    prompt = sum(float(line.split()[-1]) for line in metrics.splitlines()
                 if line.startswith("vllm:prompt_tokens_total"))
    extra = (status.get("twins") or {}).get("extra_prompt_tokens", 0)
    print(f"{args.clients} streaming clients x {args.rounds} rounds, {args.repeats} repeats each way, "
          f"sample {args.sample}")
    print(f"p50 latency  direct {q(direct, 50) * 1e3:8.1f} ms  proxy {q(through, 50) * 1e3:8.1f} ms  "
          f"ratio {q(through, 50) / q(direct, 50):.3f}")
    print(f"p99 latency  direct {q(direct, 99) * 1e3:8.1f} ms  proxy {q(through, 99) * 1e3:8.1f} ms  "
          f"ratio {q(through, 99) / q(direct, 99):.3f}")
    d, p = statistics.median(rate_d), statistics.median(rate_p)
    print(f"throughput   direct {d:8.1f} req/s  proxy {p:8.1f} req/s  ratio {p / d:.3f}")
    if prompt:
        print(f"twins' extra prompt tokens: {extra:.0f} of {prompt:.0f} the upstream took "
              f"({extra / prompt:.2%})")


if __name__ == "__main__":
    main()
