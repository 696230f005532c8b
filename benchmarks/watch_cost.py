"""What kvdiag watch costs a client: the same chat traffic (kvdiag.watch.clients, all
streaming) straight to a `kvdiag serve` and through `kvdiag watch` in front of it, in one run,
alternating, several times. Prints p50 and p99 request latency and throughput, proxy over
direct, and the twins' extra load on the upstream as a share of its prompt tokens.

    python benchmarks/watch_cost.py [--clients 64] [--rounds 3] [--repeats 3] [--sample 0.01] [--pin]
        [--tokenizer fixtures/canary]

Targets (issue 39): p50 <= 1.05x, throughput >= 0.95x. `--pin` gives the proxy a core of its
own (the last one) and the server and the clients the rest, in both arms: how a watch runs
beside a GPU server, whose CPU is not the proxy's. Without it they all share every core, so
the proxy's CPU is taken from the server's."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvdiag.watch.clients import run_clients  # noqa: E402
from tests.kvdiag.serving import served, watching  # noqa: E402


def _once(url: str, args, arm: str) -> tuple[list[float], float]:
    start = time.perf_counter()
    traffic = asyncio.run(run_clients(url, "canary", clients=args.clients, rounds=args.rounds,
                                      stream_share=1.0, document_words=60, max_tokens=16,
                                      seed=args.seed, quote_share=0))
    wall = time.perf_counter() - start
    if traffic.failed:  # said, not hidden: the ratios below count what completed
        print(f"{arm}: {traffic.failed} of {traffic.failed + traffic.requests} requests failed "
              f"({traffic.errors})")
    return traffic.latencies, traffic.requests / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="kvdiag watch --tokenizer: the proxy tokenizes "
                    "prompts itself (e.g. fixtures/canary) instead of asking the upstream's /tokenize")
    ap.add_argument("--pin", action="store_true",
                    help="the proxy on the last core alone, the server and the clients on the rest")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        ap.error(f"--pin needs at least 2 cores; this process may use {len(cores)}")
    rest, own = (set(cores[:-1]), {cores[-1]}) if args.pin else (set(cores), set(cores))
    os.sched_setaffinity(0, rest)  # a child process takes its parent's cores when it starts
    serve = ("--num-blocks", "4096", "--max-num-seqs", "64", "--max-model-len", "2048")
    with served(*serve) as (upstream, _), TemporaryDirectory() as tmp:
        os.sched_setaffinity(0, own)
        local = ("--tokenizer", args.tokenizer) if args.tokenizer else ()
        with watching(upstream, "--file", f"{tmp}/w.jsonl", "--sample", str(args.sample),
                      "--warmup", "0", *local) as url:
            os.sched_setaffinity(0, rest)
            direct, through, rate_d, rate_p, status, metrics = _compare(upstream, url, args)
    _print(args, cores, rest, own, direct, through, rate_d, rate_p, status, metrics)


def _compare(upstream: str, url: str, args):
    """Direct and proxied runs, alternating, after one warm-up run: latencies and rates each
    way, the proxy's status and the upstream's metrics."""
    direct, through, rate_d, rate_p = [], [], [], []
    _once(upstream, args, "direct (warm-up)")  # warm both paths' caches and connections
    for _ in range(args.repeats):
        lat, rate = _once(upstream, args, "direct")
        direct += lat
        rate_d.append(rate)
        lat, rate = _once(url, args, "through the proxy")
        through += lat
        rate_p.append(rate)
    while (status := httpx.get(url + "/kvdiag/status", timeout=10).json())["queue"]:
        time.sleep(0.2)  # the checks finish after the traffic
    watched = {line.split()[0]: float(line.split()[1]) for line in
               httpx.get(url + "/kvdiag/metrics", timeout=10).text.splitlines()
               if line.startswith(("kvdiag_watch_requests_total", "kvdiag_watch_judged_total"))}
    status["judged"] = (watched.get("kvdiag_watch_judged_total", 0),
                        watched.get("kvdiag_watch_requests_total", 0))
    metrics = httpx.get(upstream + "/metrics", timeout=10).text
    return direct, through, rate_d, rate_p, status, metrics


def _print(args, cores, rest, own, direct, through, rate_d, rate_p, status, metrics) -> None:
    def q(xs, p):
        return statistics.quantiles(xs, n=100)[p - 1]

    # the upstream's prompt tokens, both arms and the twins: vLLM's counter, else the prefix
    # cache's queries in tokens (kvdiag serve counts every prompt token it looks up there)
    prompt = next((total for name in ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total")
                   if (total := sum(float(line.split()[-1]) for line in metrics.splitlines()
                                    if line.startswith(name + " ") or line.startswith(name + "{")))),
                  0.0)
    extra = (status.get("twins") or {}).get("extra_prompt_tokens", 0)
    where = (f"the proxy alone on core {sorted(own)}, the server and the clients on {sorted(rest)}"
             if args.pin else f"the proxy, the server and the clients sharing cores {cores}")
    tokens = f"prompts tokenized by the proxy ({args.tokenizer})" if args.tokenizer else \
        "prompts tokenized at the upstream's /tokenize"
    judged, relayed = status["judged"]
    print(f"{args.clients} streaming clients x {args.rounds} rounds, {args.repeats} repeats each way, "
          f"sample {args.sample}; {where}; {tokens}; {judged:.0f} of {relayed:.0f} requests "
          "through the proxy judged")
    for name, p in (("p50", 50), ("p99", 99)):
        d, t = q(direct, p), q(through, p)
        print(f"{name} latency  direct {d * 1e3:8.1f} ms  proxy {t * 1e3:8.1f} ms  "
              f"ratio {t / d:.3f}  (+{(t - d) * 1e3:.1f} ms)")
    d, p = statistics.median(rate_d), statistics.median(rate_p)
    print(f"throughput   direct {d:8.1f} req/s  proxy {p:8.1f} req/s  ratio {p / d:.3f}")
    if status.get("unreachable"):
        print(f"the proxy answered 502 where the upstream could not be reached: {status['unreachable']}")
    if prompt:
        print(f"twins' extra prompt tokens: {extra:.0f} of {prompt:.0f} the upstream took "
              f"({extra / prompt:.2%})")


if __name__ == "__main__":
    main()
