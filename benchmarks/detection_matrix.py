"""The full detection matrix: a healthy engine and every fault of its catalog, through the
model-free audit (vLLM only) and through a real server per fault (`kvdiag detect --paths
audit,live`), on the smoke suite. Prints the matrix, the machine's load before and after,
and per fault the ratio of the two ways' wall times measured in the same run (how much
faster the model-free audit finds a fault than a live probe does).

    .venv-vllm/bin/python benchmarks/detection_matrix.py                 # vLLM: audit + live
    .venv/bin/python benchmarks/detection_matrix.py --engine sglang      # SGLang: live only

The vLLM run needs `make vllm-env` (vLLM's allocator importable, for the audit) and `make
vllm-cpu-env` (the servers); SGLang needs `make sglang-cpu-env`. About 1.5 min a live row on
2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from kvdiag.engines.spec import ENGINES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm", choices=tuple(ENGINES))
    parser.add_argument("--faults", default="all")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from kvdiag.commands.detect import detect

    paths = ["live"] if ENGINES[args.engine].no_audit else ["audit", "live"]
    load = os.getloadavg()
    result = detect(args.engine, [args.faults], paths, "smoke", out_dir=args.out, info=print)
    after = os.getloadavg()
    rows = result.summary.matrix
    print(f"\n{'fault':24} {'path':6} {'verdict':13} {'expected':9} {'corrupted':>9} {'round':>5} "
          f"{'to first':>8} {'numerics':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r['fault']:24} {r['path']:6} {r['verdict'].upper():13} {r['expected']:9} "
              f"{_s(r['corrupted']):>9} {_s(r['first_round']):>5} {_s(r['requests_to_first']):>8} "
              f"{_s(r['numerics']):>8} {r['seconds']:>7.1f}")
    if len(paths) == 2:
        print("\nlive / audit wall time, per fault (the same run):")
        wall = {(r["fault"], r["path"]): r["seconds"] for r in rows}
        for fault in dict.fromkeys(r["fault"] for r in rows):
            ratio = wall[(fault, "live")] / max(wall[(fault, "audit")], 1e-9)
            print(f"  {fault:24} {ratio:6.1f}x")
    print(f"\nload average (1, 5, 15 min): before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}; {os.cpu_count()} cores")
    print(f"{result.verdict.value.upper()}: {result.summary.reason}; {result.run_dir}")
    return result.exit_code


def _s(value) -> str:
    return "-" if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
