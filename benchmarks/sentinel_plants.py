"""The sentinel against planted faults, run by run: `kvdiag probe --target ENGINE-local:FAULT
--suite smoke` (the default traffic, the sentinel on), `--runs` fresh servers per fault, and
the healthy engine too. One line per run: the verdict, whether the sentinel caught it, its
bad reads, how many requests' answers departed, the largest attention leakage of a round
(with --leakage; NaN where a wrong read's attention went unweighed), and the sentinel's
first finding.

    python benchmarks/sentinel_plants.py                          # vLLM's lifecycle plants, 1 run each
    python benchmarks/sentinel_plants.py --runs 10 --faults ref-undercount,stale-lookup
    python benchmarks/sentinel_plants.py --faults healthy --runs 10   # false positives
    python benchmarks/sentinel_plants.py --faults healthy --probe-args="--adapter canary-lora"
    python benchmarks/sentinel_plants.py --faults healthy --probe-args="--model build/mamba-hybrid
        --engine-arg=--prefix-match-unit=16"     # copy-on-write (kvdiag fixtures build-mamba-hybrid)
    python benchmarks/sentinel_plants.py --engine llamacpp     # SmolLM2, natural style; healthy
        # there is the stock tree with the sentinel patched in, and a fix (upstream-fixes) is
        # probed as a fault is

Each run takes minutes on 2 CPU cores (a server start and the whole probe). The last lines
count, per fault, the runs the sentinel failed and the runs the answers alone would have.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def lifecycle_plants(engine: str) -> list[str]:
    from kvdiag.engines.spec import engine_spec

    return [name for name, f in engine_spec(engine).catalog().items() if f.event]


def event_of(engine: str, fault: str | None) -> str | None:
    from kvdiag.engines.spec import engine_spec

    found = engine_spec(engine).catalog().get(fault.split(":")[0]) if fault else None  # NAME[:ARG]
    return found.event if found else None  # none: healthy, or a fix


def one(engine: str, fault: str | None, out: Path, extra: list[str], suite: str) -> dict:
    target = f"{engine}-local" + (f":{fault}" if fault else "")
    on = ["--sentinel", "on"] if fault is None else []  # llama.cpp's stock target runs none unasked
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", target, "--suite",
                          suite, "--out", str(out), "--json", *on, *extra], capture_output=True, text=True)
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {"exit": run.returncode, "verdict": "error", "why": run.stderr.strip()[-300:]}
    sentinel = s.get("sentinel") or {}
    bad = sum(sentinel.get(k, 0) for k in ("foreign", "unwritten", "overwrite"))
    found = sentinel.get("findings") or []
    f = next((f for f in found if f["kind"] != "overwrite"), found[0] if found else None)
    first = "-" if f is None else (
        f"{f['kind']} {f['where'] or f['request']} positions {f['positions'][:2]} "
        f"writer {(f['writers_where'] or [None])[0] or (f['writers'] or ['-'])[0]} "
        f"({', '.join(f['writer_context'])}) step {f['step']} [{'; '.join(f['context'])}]")
    event = event_of(engine, fault)
    events = {r["event"]: r["reached"] for r in s.get("events") or []}
    if event is not None:
        reached = f"{event} {'reached' if events.get(event) else 'NOT reached'}"
    else:  # a healthy run (or a plant of no one event): every event the run reached
        reached = "reached " + (",".join(e for e, hit in events.items() if hit) or "none")
        missed = [e for e, hit in events.items() if not hit]
        reached += f"; not {','.join(missed)}" if missed else ""
        adapter = (s.get("traffic") or {}).get("adapter")
        reached += f"; LoRA rounds on {adapter}" if adapter else ""
        reached += f"; {sentinel['copies']} copy-on-write copies" if sentinel.get("copies") else ""
    leaks = [r["attention_leakage"] for r in s.get("rounds") or []
             if r["allocator"] == "shared" and r.get("attention_leakage") is not None]
    finite = [x for x in leaks if x == x]
    leak = ("not weighed" if not sentinel.get("attention") else
            f"largest round {max(finite):.4f}" if finite else "no round")
    leak += f" ({len(leaks) - len(finite)} rounds unmeasured)" if len(finite) < len(leaks) else ""
    return {"exit": run.returncode, "verdict": s["verdict"], "sentinel_bad": bad,
            "reads": sentinel.get("reads", 0), "answers": s["corrupted_requests"], "first": first,
            "event": reached, "leakage": leak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="vllm")
    p.add_argument("--faults", default=None, help="comma-separated; 'healthy' for none "
                   "(default: the engine's lifecycle plants)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--suite", default=None, help="the probe's suite (default: smoke; natural for "
                   "llamacpp, whose model is SmolLM2's GGUF)")
    p.add_argument("--leakage", action="store_true", help="weigh attention on the slots read "
                   "wrong too (KVDIAG_SENTINEL_ATTENTION=1: the rounds' leakage; it costs)")
    p.add_argument("--probe-args", default="", help="more `kvdiag probe` arguments, one string "
                   "(e.g. \"--adapter canary-lora\" for LoRA rounds on vLLM)")
    args = p.parse_args()
    if args.leakage:
        import os

        os.environ["KVDIAG_SENTINEL_ATTENTION"] = "1"  # the probes' servers inherit it
    faults = args.faults.split(",") if args.faults else lifecycle_plants(args.engine)
    tally = {}
    root = Path(tempfile.mkdtemp(prefix="kvdiag-sentinel-plants-"))
    for fault in faults:
        for k in range(args.runs):
            r = one(args.engine, None if fault == "healthy" else fault, root / f"{fault}-{k}",
                    shlex.split(args.probe_args),
                    args.suite or ("natural" if args.engine == "llamacpp" else "smoke"))
            print(f"{fault:26s} run {k + 1}: {r['verdict']:12s} event {r.get('event', '-')}; sentinel bad reads "
                  f"{r.get('sentinel_bad', '-')} of {r.get('reads', '-')} checked; answers departed "
                  f"{r.get('answers', '-')}; leakage {r.get('leakage', '-')}; first: {r.get('first', r.get('why'))}",
                  flush=True)
            t = tally.setdefault(fault, [0, 0, 0])
            t[0] += 1
            t[1] += bool(r.get("sentinel_bad"))
            t[2] += bool(r.get("answers"))
    for fault, (runs, by_sentinel, by_answers) in tally.items():
        print(f"{fault}: sentinel caught {by_sentinel} of {runs} runs; answers departed in {by_answers}")


if __name__ == "__main__":
    main()
