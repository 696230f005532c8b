"""Wall time of `kvdiag reproduce` as a newcomer runs it (a fresh process each time), for the
default case: cold (an empty cache, so the contiguous reference is computed) and warm (the
same cache again, so it is read back). Prints each time, its ratio to the 30 s budget of the
default run on 2 cores, the warm/cold ratio, the CPU seconds the run used, where the time
went (summary.json's per-allocator seconds) and the load average, since a busy machine
stretches wall time. With --long, also the 32-session 8192 + 512 variant, cold and warm.

    python benchmarks/reproduce_time.py [--repeats 1] [--long]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 30.0  # the newcomer's first run (issue 17): the verdict within the first minute
VARYING = ("created", "command", "seconds", "wall_seconds")  # differ between any two runs


def once(args: list[str], cache_home: Path) -> tuple[float, float, dict]:
    """(wall s, CPU s of the child, summary) of one `kvdiag reproduce` in a new process."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kvdiag", "reproduce", "--out", str(out), *args],
                              check=False, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        summary = out / "summary.json"
        if not summary.is_file():
            sys.exit(f"kvdiag reproduce {' '.join(args)} exited {done.returncode} without a "
                     f"summary: {done.stderr.strip().splitlines()[-1:] or ['(no stderr)']}")
        return wall, cpu, json.loads(summary.read_text())


def differing(a: dict, b: dict) -> list[str]:
    """Keys of two summaries that differ, but for those that differ between any two runs
    (times, paths); `environment` differs when a commit landed between the runs."""
    return sorted(k for k in set(a) | set(b) if k not in VARYING and a.get(k) != b.get(k))


def where(summary: dict) -> str:
    return "  ".join(f"{case}: " + ", ".join(f"{k} {v:.1f}s" for k, v in secs.items())
                     for case, secs in summary.get("seconds", {}).items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="cold/warm pairs per variant (best kept)")
    ap.add_argument("--long", action="store_true", help="also time the long variant (32 x 8704)")
    args = ap.parse_args()
    runs = [("default (trigger, buggy + guarded)", [])]
    if args.long:
        runs.append(("long (32 sessions, 8192 + 512)", ["--case", "long"]))
    print(f"{os.cpu_count()} CPUs; load average before: "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    for name, extra in runs:
        best: dict[str, tuple[float, float, dict]] = {}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:  # cold: nothing cached yet
                for phase in ("cold", "warm"):
                    got = once(extra, Path(cache))
                    if phase not in best or got[0] < best[phase][0]:
                        best[phase] = got
        for phase, (wall, cpu, summary) in best.items():
            print(f"{name}, {phase}: {wall:.1f} s wall, {cpu:.1f} CPU s; ratio to the "
                  f"{BUDGET_S:.0f} s budget {wall / BUDGET_S:.2f}")
            print(f"    {where(summary)}")
        print(f"{name}: warm / cold wall ratio {best['warm'][0] / best['cold'][0]:.2f}; warm "
              f"summary keys that differ from cold (times masked): {differing(best['warm'][2], best['cold'][2])}")
    print("load average after: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
