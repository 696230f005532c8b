"""kvdiag detect: the detection matrix. A healthy engine and every fault of its catalog, each
through the model-free audit (vLLM's own KVCacheManager, the fault planted in-process) and,
with `live`, through a real server with the fault planted (the probe or the isolation audit,
as the catalog's `live` says). One row per (fault, path): what kvdiag concluded, against
what it had to conclude.

    plan     faults and paths checked before anything starts; the trace planned once
    measure  per row: the audit (commands.audit.planted_audit) or a live run (commands.probe /
             commands.isolation, each into its own run directory under the matrix's)
    judge    kvdiag.verdicts.judge_matrix: healthy passes (no false positive) and every fault
             gives its expected verdict
    finish   MatrixSummary (rows in `matrix`), the matrix page
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kvdiag.commands.lifecycle import finish_run, no_progress
from kvdiag.engines.fault import Fault
from kvdiag.engines.spec import EngineSpec, engine_spec
from kvdiag.errors import KvdiagError
from kvdiag.record.results import RunResult, Signature, model_label
from kvdiag.record.summary import IsolationSummary, MatrixSummary, ProbeSummary
from kvdiag.record.summary_rows import MatrixRow
from kvdiag.verdicts import Verdict, caught_as_expected, expected_detection, judge_matrix
from kvdiag.verdicts.detection import audit_caught_by, isolation_caught_by, probe_caught_by

HEALTHY = "healthy"
PATHS = ("audit", "live")


def choose(engine: EngineSpec, faults: list[str] | None, paths: list[str]) -> tuple[list[str], list[str]]:
    """The rows' faults (healthy first) and paths, checked before anything starts."""
    known = engine.catalog()
    names = [n for f in faults or ["all"] for n in f.split(",") if n]
    if "all" in names:
        names = list(known)
    for n in names:  # NAME:ARG (slot-omitted:5) too, checked before anything starts
        if n != HEALTHY and n.partition(":")[0] in known:
            engine.check_fault(n)
    unknown = [n for n in names if n.partition(":")[0] not in known and n != HEALTHY]
    if unknown:
        raise KvdiagError(f"unknown {engine.label} fault {unknown[0]!r} (known: {', '.join(known)})")
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise KvdiagError(f"--paths {','.join(paths)}: expected audit, live or both")
    if engine.no_audit and "audit" in paths:
        raise KvdiagError(f"--engine {engine.name} has no model-free audit ({engine.no_audit}): "
                          "give --paths live")
    return [HEALTHY] + [n for n in dict.fromkeys(names) if n != HEALTHY], list(dict.fromkeys(paths))


def row(name: str, fault: Fault | None, path: str, verdict: Verdict, reason: str, seconds: float,
        **facts) -> MatrixRow:
    """One row of the matrix (results.parquet and summary.json's `matrix`). `facts`: what the
    run counted (caught_by, corrupted, first_round, requests_to_first, numerics, run_dir)."""
    want = expected_detection(fault.live if fault else None, path)
    return MatrixRow(fault=name, path=path, fault_class=fault.fault_class if fault else "-",
                     event=(fault.event or "lookup") if fault else "-",
                     reports="; ".join(fault.reports) if fault else "", verdict=verdict, expected=want,
                     caught=caught_as_expected(verdict, want), seconds=round(seconds, 1), reason=reason,
                     **facts)


def unreachable(fault: Fault | None, path: str) -> MatrixRow | None:
    """The row of a fault this path cannot reach here (inconclusive, the reason given, not
    caught), or None."""
    if fault is None or path not in fault.unreachable:
        return None
    from kvdiag.verdicts import judge_unreached

    judged = judge_unreached(fault.unreachable[path])
    return row(fault.name, fault, path, judged.verdict, judged.reason, 0.0)


def audit_rows(names: list[str], faults: dict, trace, info: Callable[[str], None]) -> list[MatrixRow]:
    from kvdiag.commands.audit import judge, planted_audit
    from kvdiag.runners.replay.vllm_api import load

    api, out = load(), []
    for name in names:
        info(f"audit: {name}")
        t0 = time.perf_counter()
        if (why := unreachable(faults.get(name.partition(":")[0]), "audit")) is not None:
            out.append(why)
            continue
        run = planted_audit(trace, None, None if name == HEALTHY else name, api=api)
        judged = judge(run)
        first = run.first_corruption()
        out.append(row(name, faults.get(name.partition(":")[0]), "audit", judged.verdict, judged.reason,
                       time.perf_counter() - t0, corrupted=run.corrupted_requests(),
                       first_round=first[0], requests_to_first=first[1], numerics=0,
                       caught_by=audit_caught_by(run.section)))
    return out


def live_row(engine: EngineSpec, name: str, fault: Fault | None, suite: str, case: str | None,
             out: Path, info: Callable[[str], None]) -> MatrixRow:
    """One fault on a real server kvdiag starts (its own run directory under `out`)."""
    from kvdiag.commands.isolation import audit_target
    from kvdiag.commands.probe import probe
    from kvdiag.commands.probe_args import ProbeArgs
    from kvdiag.runners.live.isolation_plan import IsolationPlan
    from kvdiag.runners.live.phases import ProbeSettings
    from kvdiag.runners.live.slotlife import REUSE_CHUNK

    if (why := unreachable(fault, "live")) is not None:
        return why
    target = engine.target_kind + ("" if fault is None else f":{name}")
    mode = fault.live if fault else "probe"
    adapter = engine.adapter if fault is not None and fault.adapter else None
    info(f"live: {target} ({mode})")
    t0 = time.perf_counter()
    try:
        if mode.startswith("isolation"):
            result = audit_target(None, target, None, None, IsolationPlan(adapter=adapter),
                                  out_dir=out / f"{name}-live", info=info)
        else:
            settings = ProbeSettings(adapter=adapter)
            model, engine_args = None, ()
            if mode == "probe-mamba":  # hits inside a block: the Mamba hybrid, a smaller match unit
                from kvdiag.canary.mamba_hybrid import build_mamba_hybrid

                model = str(out / "mamba-hybrid")
                build_mamba_hybrid(Path(model))
                engine_args = ("--prefix-match-unit=16",)
            elif mode == "probe-reuse":  # llama.cpp's chunk reuse, and the slot phase's reuse group
                engine_args = (f"--cache-reuse={REUSE_CHUNK}",)
            result = probe(ProbeArgs(suite=suite, case=case, target=target, settings=settings,
                                     model=model, engine_args=engine_args,
                                     out_dir=out / f"{name}-live"), info=info)
    except KvdiagError as e:  # the run could not be made: an error row, never a pass
        from kvdiag.verdicts import judge_unmeasured

        judged = judge_unmeasured(str(e).splitlines()[0])
        return row(name, fault, "live", judged.verdict, judged.reason, time.perf_counter() - t0)
    s = result.summary
    probe = s if isinstance(s, ProbeSummary) else None  # else the isolation audit's
    firsts = (probe.first_divergences or []) if probe else []
    landed = _landed(probe) if probe else []
    return row(name, fault, "live", result.verdict, s.reason, time.perf_counter() - t0,
               corrupted=probe.corrupted_requests if probe else None,
               first_round=firsts[0].round if firsts else None,
               requests_to_first=min(landed) + 1 if landed else None,
               numerics=probe.numerics_requests if probe else None, run_dir=str(result.run_dir),
               caught_by=_live_channels(s))


def _landed(probe: ProbeSummary) -> list[int]:
    """When each detection could first be made, among the run's requests, by any channel: a
    corrupted shared answer or a lifecycle answer the judge labelled corruption (the later of
    the request's and its isolated twin's landings), an over-hit, a sentinel finding (its
    reader, where that is one of the run's requests)."""
    found = probe.sentinel.findings if probe.sentinel else []
    landed = ([f.index for f in probe.first_divergences or []]
              + [e.index for e in probe.key_coverage.oracle.examples]
              + [q.index for q in probe.lifecycle.divergences if q.label == "corruption"]
              + [f.index for f in found])
    return [i for i in landed if i is not None]


def _live_channels(s: ProbeSummary | IsolationSummary) -> str:
    """How a live run caught its fault (kvdiag.verdicts.detection): the isolation audit, or
    the probe's channels from the blocks its judge counted."""
    if isinstance(s, IsolationSummary):
        return isolation_caught_by(s.verdict, len(s.leaks), s.sentinel)
    return probe_caught_by(sentinel=s.sentinel, oracle=s.key_coverage.oracle,
                           corrupted_requests=s.corrupted_requests,
                           prompt_logprobs=s.prompt_logprobs, topk=s.topk,
                           ground_truth=s.ground_truth)


def detect(engine: str = "vllm", faults: list[str] | None = None, paths: list[str] = ("audit",),
           suite: str = "smoke", case: str | None = None, *, out_dir: Path | None = None,
           info: Callable[[str], None] = lambda _: None, progress=no_progress) -> RunResult:
    """kvdiag detect, start to finish."""
    import pandas as pd

    from kvdiag.paths import CANARY
    from kvdiag.planning.suites import load_cases
    from kvdiag.record.rundir import RunDir, Timer

    timer = Timer()
    spec = engine_spec(engine, "--engine")
    names, paths = choose(spec, faults, list(paths))
    known = spec.catalog()
    loaded, (chosen,) = load_cases(suite, case, one=True)
    rows: list[MatrixRow] = []
    with RunDir.begin(out_dir, f"detect-{engine}") as run, progress("detect", len(names) * len(paths)) as update:
        if "audit" in paths:
            from kvdiag.runners.replay.audit import trace_for_case

            info(f"planning {loaded.name}/{chosen.name} and running the contiguous reference ...")
            trace = trace_for_case(loaded, chosen, model=CANARY)
            rows += audit_rows(names, known, trace, info)
            update(advance=len(names))
        if "live" in paths:
            for name in names:
                rows.append(live_row(spec, name, known.get(name.partition(":")[0]), suite, chosen.name, run.path, info))
                update(advance=1)
    judged = judge_matrix((f"{r.fault}/{r.path}", r.verdict, r.expected) for r in rows)
    # the model the rows ran on: the canary, or a live-only engine's own default (llama.cpp's GGUF)
    served = CANARY if "audit" in paths else spec.launcher().default_model()
    signature = Signature(engine=f"detect:{engine}", allocators=tuple(paths), block_size=loaded.block_size,
                          model=model_label(served), suite=loaded.name, seed=loaded.seed)
    summary = MatrixSummary(signature=signature.format(), suite=loaded.name, verdict=judged.verdict,
                            reason=judged.reason, engine=engine, paths=paths, matrix=rows)
    frame = pd.DataFrame([r.model_dump(mode="json") for r in rows])
    return finish_run(RunResult("matrix", frame, summary), run, timer)
