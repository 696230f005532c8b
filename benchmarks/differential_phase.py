"""What the differential (key-coverage) phase costs: one default probe of a warm server, and
from its own rounds.jsonl the phase's seconds (first request sent to last answer back)
beside the whole probe's, in the same run; then `--repeats` runs of `--differential-only`,
each timed whole (planning and the server's tokenizer included).

    python benchmarks/differential_phase.py                       # starts kvdiag serve (canary)
    python benchmarks/differential_phase.py --base-url URL --model NAME [--suite smoke]
    python benchmarks/differential_phase.py --target vllm-local     # each probe starts a vLLM

The phase's seconds are read from the requests' own send and answer times, so a server's
start (with --target) is not counted in them.

Prints the phase's seconds, its requests, and phase / whole probe as a ratio; issue 30 asks
for the phase under 60 s against a warm server on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def probe(where: list[str], suite: str, out: Path, *extra: str) -> tuple[float, dict]:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", *where,
                          "--suite", suite, "--out", str(out), "--json", *extra],
                         capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if not run.stdout.strip():
        raise SystemExit(f"the probe wrote no summary: {run.stderr[-2000:]}")
    return seconds, json.loads(run.stdout)


def phase_seconds(run_dir: Path) -> tuple[float, int]:
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    diff = [r for r in rows if r["phase"] in ("diff", "diff-isolated")]
    return max(r["done"] for r in diff) - min(r["sent"] for r in diff), len(diff)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url")
    ap.add_argument("--target", help="vllm-local or sglang-local: each probe starts its server")
    ap.add_argument("--model", default="canary")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.base_url or args.target:
        measure(["--target", args.target] if args.target else
                ["--base-url", args.base_url, "--model", args.model], args)
        return
    from tests.kvdiag.serving import served, smoke_pool

    with served("--allocator", "prefix-cache", "--num-blocks", str(smoke_pool()), "--max-num-seqs", "16",
                "--max-model-len", "2048") as (url, _):
        measure(["--base-url", url, "--model", args.model], args)


def measure(where: list[str], args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whole, summary = probe(where, args.suite, Path(tmp) / "full")
        phase, requests = phase_seconds(Path(tmp) / "full")
        print(f"default probe: {whole:.1f} s, verdict {summary['verdict']}; its differential phase: "
              f"{phase:.1f} s for {requests} requests; phase / probe = {phase / whole:.3f}")
        for i in range(args.repeats):
            alone, s = probe(where, args.suite, Path(tmp) / f"d{i}", "--differential-only")
            p, n = phase_seconds(Path(tmp) / f"d{i}")
            print(f"--differential-only #{i + 1}: {alone:.1f} s whole, phase {p:.1f} s ({n} requests), "
                  f"verdict {s['verdict']}, over-hits {s['key_coverage']['oracle']['over_hits']}")


if __name__ == "__main__":
    main()
