"""What `kvdiag watch` sees of a fault on ordinary traffic, against what the traffic reached:
a `kvdiag serve --allocator FAULT --sentinel` (or a real vLLM with FAULT planted and kvdiag's
sentinel in its engine core) behind the proxy, chat clients through it (a shared document,
uneven turns, half streaming), then the watch's findings beside the sentinel's exact count of
foreign and unwritten KV reads inside the server. Prints the share of twins that departed,
and over-hits per request.

    python benchmarks/watch_reach.py --allocator ref-undercount [--model DIR] [--clients 16]
        [--rounds 6] [--num-blocks 160] [--sample 1.0]
    python benchmarks/watch_reach.py --engine vllm --allocator ref-undercount --model DIR
        --num-blocks 40      # vLLM's blocks hold 32 tokens (make vllm-cpu-env)

--model: a Hugging Face directory (`kvdiag fixtures import-gguf` gives SmolLM2); default the
canary, which answers random text the same whatever it reads (so its twins rarely depart)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvdiag.runners.live.sentinel import observe  # noqa: E402
from kvdiag.watch.clients import run_clients  # noqa: E402
from kvdiag.watch.log import read_watch  # noqa: E402
from tests.kvdiag.serving import served, watching  # noqa: E402


@contextmanager
def _upstream(args, sentinel: Path):
    if args.engine == "vllm":
        from kvdiag.engines.vllm.launcher import VllmLocal
        from kvdiag.paths import CANARY

        fault = None if args.allocator == "none" else args.allocator
        with VllmLocal(args.model or CANARY, fault=fault, num_blocks=args.num_blocks,
                       max_model_len=1024, served_model="model", sentinel=sentinel,
                       log_path=sentinel.with_name("vllm.log")) as server:
            yield server.base_url
        return
    extra = ("--model", args.model, "--dtype", "float32") if args.model else ()
    with served("--allocator", args.allocator, "--num-blocks", str(args.num_blocks),
                "--max-num-seqs", "16", "--max-model-len", str(args.max_model_len), "--sentinel", str(sentinel),
                *extra, timeout=600) as (upstream, _):
        yield upstream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("serve", "vllm"), default="serve")
    ap.add_argument("--allocator", default="ref-undercount",
                    help="kvdiag serve's allocator, or the vLLM fault to plant ('none': healthy)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--num-blocks", type=int, default=160)
    ap.add_argument("--sample", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=2048,
                    help="kvdiag serve's context (a longer conversation is refused with a 400)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with TemporaryDirectory() as tmp:
        sentinel, path = Path(tmp) / "sentinel.jsonl", Path(tmp) / "watch.jsonl"
        with _upstream(args, sentinel) as upstream:
            model = httpx.get(upstream + "/v1/models", timeout=10).json()["data"][0]["id"]
            with watching(upstream, "--file", str(path), "--sample", str(args.sample),
                          "--budget", "100", "--warmup", "0", "--pool-tokens", "0",
                          "--window", "5") as url:
                start = time.time()
                traffic = asyncio.run(run_clients(url, model, clients=args.clients,
                                                  rounds=args.rounds, seed=args.seed))
                while True:  # the twins finish after the traffic
                    s = httpx.get(url + "/kvdiag/status", timeout=10).json()
                    if s["queue"] == 0 and s["twins_running"] == 0:
                        break
                    time.sleep(0.5)
                wall = time.time() - start
        block, _ = observe(sentinel, 0, wait=0)
        watch = read_watch(path)
    reached, departed = watch.total("reached"), watch.total("departures")
    print(f"{args.engine} {args.allocator} on {args.model or 'the canary'}: {traffic.requests} requests "
          f"({traffic.failed} failed{f': {traffic.errors}' if traffic.failed else ''}) from "
          f"{args.clients} clients x {args.rounds} rounds in {wall:.0f} s")
    print(f"sentinel (inside the server): {block.foreign} foreign, {block.unwritten} unwritten slot "
          f"reads in {len(block.findings)} findings, over {block.reads} reads checked")
    print(f"watch: {watch.counted('over_hit')} over-hits in {watch.total('judged')} judged requests; "
          f"{departed} of {reached} twins that hit the cache departed "
          f"({departed / reached if reached else float('nan'):.3f}); "
          f"{watch.total('numerics')} near-tie divergences; {watch.total('twins')} twins in all")


if __name__ == "__main__":
    main()
