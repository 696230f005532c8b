"""How reliably the default probe catches the reported trigger: `kvdiag serve --allocator
buggy` (a recycled block keeps its old hash entry on the jump path), probed with the default
traffic on fresh servers, with the pool the smoke suite sizes (--num-blocks as the tests
start it) and with the server's default pool. Issue 31 asks for FAIL on every run, each with
at least 5 corrupted requests. Every server runs the sentinel (`kvdiag serve --sentinel`), and
the probe reads it: a run also says how many KV reads the sentinel found foreign (issue 37:
FAIL on every run by exact foreign reads; `--allocator guarded` must show 0).

    python benchmarks/buggy_server.py                        # 10 fresh servers per pool
    python benchmarks/buggy_server.py --runs 3 --pools smoke
    python benchmarks/buggy_server.py --runs 3 --pools smoke --allocator guarded
    python benchmarks/buggy_server.py --runs 1 --record runs.jsonl   # one run, kept
    python benchmarks/buggy_server.py --report runs.jsonl            # the table of kept runs

Prints one line per run (pool, verdict, corrupted requests, events reached, seconds), then
per pool: runs that failed / runs, and the fewest corrupted / the least asked for (5).
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

LEAST = 5  # corrupted requests every run must find (issue 31)


def server_args(pool: str, allocator: str = "buggy") -> list[str]:
    from tests.kvdiag.serving import smoke_pool

    args = ["--allocator", allocator, "--max-num-seqs", "16", "--recycled-block-fill", "nan",
            "--max-model-len", "2048", "--max-num-batched-tokens", "512"]
    return args + (["--num-blocks", str(smoke_pool())] if pool == "smoke" else [])


def one(pool: str, allocator: str = "buggy") -> dict:
    from tests.kvdiag.serving import served

    with tempfile.TemporaryDirectory() as tmp:
        watch = Path(tmp) / "sentinel.jsonl"
        with served(*server_args(pool, allocator), "--sentinel", str(watch)) as (url, _):
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", url,
                                  "--model", "canary", "--suite", "smoke", "--out",
                                  str(Path(tmp) / "p"), "--json", "--sentinel", str(watch)],
                                 capture_output=True, text=True, cwd=ROOT)
            seconds = time.perf_counter() - start
    if not run.stdout.strip():
        raise SystemExit(f"the probe wrote no summary: {run.stderr[-2000:]}")
    s = json.loads(run.stdout)
    sentinel = s.get("sentinel") or {}
    return {"pool": pool, "allocator": allocator, "verdict": s["verdict"],
            "corrupted": s["corrupted_requests"], "foreign": sentinel.get("foreign"),
            "unwritten": sentinel.get("unwritten"), "reads": sentinel.get("reads"),
            "reached": sum(r["reached"] for r in s.get("events", [])), "events": len(s.get("events", [])),
            "missing": [r["event"] for r in s.get("events", []) if not r["reached"]],
            "pool_blocks": s["server"]["num_blocks"], "seconds": round(seconds, 1)}


def show(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['pool']:8} {r.get('allocator', 'buggy'):8} {r['pool_blocks']:>6} blocks  "
              f"{r['verdict']:12} corrupted {r['corrupted']:3}  sentinel foreign {r.get('foreign')} "
              f"unwritten {r.get('unwritten')} of {r.get('reads')} reads  "
              f"events {r['reached']}/{r['events']}  {r['seconds']:6.1f} s"
              + (f"  (not reached: {', '.join(r['missing'])})" if r.get("missing") else ""), flush=True)


def report(rows: list[dict]) -> None:
    for pool in dict.fromkeys(r["pool"] for r in rows):
        mine = [r for r in rows if r["pool"] == pool]
        failed = sum(r["verdict"] == "fail" for r in mine)
        fewest = min(r["corrupted"] for r in mine)
        seen = sum(bool(r.get("foreign") or r.get("unwritten")) for r in mine)
        print(f"{pool}: FAIL {failed}/{len(mine)} = {failed / len(mine):.2f}; fewest corrupted "
              f"{fewest} / {LEAST} asked = {fewest / LEAST:.2f}; the sentinel saw bad reads in "
              f"{seen}/{len(mine)} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="fresh servers per pool")
    ap.add_argument("--pools", default="smoke,default", help="smoke, default, or both")
    ap.add_argument("--allocator", default="buggy", help="the server's allocator (guarded: the fix)")
    ap.add_argument("--record", type=Path, help="append each run to this JSON-lines file")
    ap.add_argument("--report", type=Path, help="only print the table of the runs kept in this file")
    a = ap.parse_args()
    if a.report:
        rows = [json.loads(line) for line in a.report.read_text().splitlines() if line.strip()]
        show(rows)
        report(rows)
        return
    rows = []
    for pool in a.pools.split(","):
        for _ in range(a.runs):
            rows.append(one(pool, a.allocator))
            show(rows[-1:])
            if a.record:
                with a.record.open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    report(rows)


if __name__ == "__main__":
    main()
