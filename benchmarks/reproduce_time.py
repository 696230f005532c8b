"""Wall time of `kvdiag reproduce` as users run it (a fresh process each time), for the
default case and, with --long, the 32-session 8192 + 512 variant. Prints each time, its
ratio to the 60 s budget of the default run, and where the time went (from summary.json).

    python benchmarks/reproduce_time.py [--repeats 2] [--long]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 60.0


def once(args: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvdiag", "reproduce", "--out", tmp, *args],
                       check=False, capture_output=True)
        wall = time.perf_counter() - t0
        return wall, json.loads((Path(tmp) / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--long", action="store_true", help="also time the long variant (32 x 8704)")
    args = ap.parse_args()
    runs = [("default (trigger, buggy + guarded)", [])]
    if args.long:
        runs.append(("long (32 sessions, 8192 + 512)", ["--cases", "long"]))
    for name, extra in runs:
        walls, summary = [], {}
        for _ in range(args.repeats):
            wall, summary = once(extra)
            walls.append(wall)
        best = min(walls)
        parts = "  ".join(f"{case}: " + ", ".join(f"{k} {v:.1f}s" for k, v in secs.items())
                          for case, secs in summary.get("seconds", {}).items())
        print(f"{name}: best {best:.1f} s of {args.repeats} (all: {', '.join(f'{w:.1f}' for w in walls)}); "
              f"ratio to the {BUDGET_S:.0f} s budget {best / BUDGET_S:.2f}")
        print(f"    {parts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
