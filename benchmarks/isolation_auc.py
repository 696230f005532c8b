"""Timing side channel of the prefix cache: ROC AUC per prefix length, per configuration.

Runs the isolation audit (kvdiag.runners.live.isolation) against `kvdiag serve` (guarded, started
here on loopback) and, when kvdiag/vllm_local and its vLLM env are there, against real vLLM
on CPU: unplanted and with the `salt-ignored` fault planted. For every (target, configuration,
prefix length) it prints the cached tokens of correct / wrong guesses, the median TTFT of
each, their ratio (wrong / correct: how much faster a cache hit answers, both measured in
the same run), and the AUC of TTFT with its Mann-Whitney p-value.

    python benchmarks/isolation_auc.py [--trials 8] [--lengths auto] [--no-vllm]

Timings depend on the machine's load; the AUC is what the attacker gets on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@contextmanager
def reference_server(allocator: str):
    from tests.kvdiag.serving import served

    with served("--allocator", allocator) as (url, _):
        yield url, "canary"


@contextmanager
def vllm_server(fault: str | None):
    from kvdiag.engines.vllm.launcher import VllmLocal  # ImportError: not there (yet)
    from kvdiag.paths import CANARY

    with VllmLocal(CANARY, fault=fault) as server:
        yield server.base_url, server.served_model


def audit(url: str, model: str, args) -> object:
    from kvdiag.runners.live.endpoint import Endpoint
    from kvdiag.runners.live.isolation import run_isolation
    from kvdiag.runners.live.isolation_plan import IsolationPlan, parse_lengths

    ep = Endpoint(url, model, timeout=300.0, retries=2)
    try:
        plan = IsolationPlan(lengths=parse_lengths(args.lengths), trials=args.trials,
                             warmup=args.warmup, max_seconds=args.max_seconds)
        return run_isolation(ep, plan)
    finally:
        ep.sync.close()


def show(target: str, result) -> None:
    print(f"\n## {target}: {result.verdict.upper()} ({result.reason})")
    print(f"block size {result.server['block_size']} ({result.server['block_size_source']}), cached "
          f"tokens from {result.server['cached_tokens_source']}, {result.requests} requests, "
          f"{result.wall_seconds:.0f} s")
    print(f"{'configuration':<12} {'tokens':>6} {'cached ok/bad':>14} {'TTFT ok ms':>10} {'TTFT bad ms':>11} "
          f"{'bad/ok':>7} {'AUC':>5} {'p':>8}  told apart")
    for c in sorted(result.cells, key=lambda c: (c["config"], c["length"])):
        ok, bad = c["ttft_correct_median_s"], c["ttft_wrong_median_s"]
        told = " + ".join(k for k in ("content", "timing") if c[f"{k}_leak"]) or "no"
        print(f"{c['config']:<12} {c['length']:>6} {c['cached_correct_mean']:>7.0f}/{c['cached_wrong_mean']:<6.0f} "
              f"{ok * 1e3:>10.1f} {bad * 1e3:>11.1f} {bad / ok:>7.2f} {c['auc']:>5.2f} {c['p_value']:>8.2g}  {told}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lengths", default="auto")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    ap.add_argument("--no-vllm", action="store_true", help="Only the reference server.")
    args = ap.parse_args()
    targets = [("reference:guarded", lambda: reference_server("guarded"))]
    if not args.no_vllm:
        targets += [("vllm-local", lambda: vllm_server(None)),
                    ("vllm-local:salt-ignored", lambda: vllm_server("salt-ignored"))]
    t0 = time.perf_counter()
    for name, start in targets:
        try:
            with start() as (url, model):
                show(name, audit(url, model, args))
        except ImportError as e:
            print(f"\n## {name}: skipped, kvdiag.engines.vllm is not available ({e})")
        except Exception as e:  # noqa: BLE001  (a missing vLLM env must not lose the other rows)
            print(f"\n## {name}: skipped, {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (timings from a machine shared with other work)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
