"""One suite run against the reference engine: plan every case, run the contiguous
reference and each allocator, compute metrics, and assemble summary.json (`run_suite`).
`reproduce`, `verify` and `probe` take a command's options to a finished run directory.
Library code: returns data, prints nothing (the CLI renders)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.lifecycle import RunResult, finish_run, no_progress
from kvdiag.paths import CANARY
from kvdiag.suites import Case, Suite, load_cases, names
from kvdiag.targets import check_allocator
from kvdiag.verdicts import FAIL, gate_verdict, judge
from kvdiag.vocab import VLLM


def case_allocators(suite: Suite, case: Case, override: list[str] | None) -> list[str]:
    return list(override or case.allocators or suite.allocators)


def total_requests(suite: Suite, cases: list[Case], override: list[str] | None) -> int:
    return sum(c.sessions * c.rounds * (1 + len(case_allocators(suite, c, override))) for c in cases)


def run_suite(suite: Suite, cases: list[Case], *, allocators: list[str] | None = None,
              model: Path | None = None, device: str = "cpu", dtype: str | None = None,
              spacy_model: str | None = None, progress: Callable[[int], None] | None = None,
              on_case: Callable[[str], None] | None = None, kind: str = "reproduce",
              use_cache: bool = True) -> RunResult:
    """Every case through the contiguous reference (read from the on-disk reference cache
    when `use_cache`) and each allocator; the RunResult with summary.json's content."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize
    from kvdiag.runners.plan import plan_case
    from kvdiag.runners.reference import run_case
    from kvdiag.runs import model_label, signature
    from reference_engine.loader import load_checkpoint

    model_dir = Path(model or suite.model or CANARY)
    vllm_api = None
    if any(VLLM in case_allocators(suite, c, allocators) for c in cases):
        from kvdiag.runners.vllm_api import load

        vllm_api = load()  # fail before anything runs if vLLM is missing or unsupported
    vllm_stats = {}
    checkpoint = load_checkpoint(model_dir)
    records, logs, seconds = [], {}, {}
    used: list[str] = []
    for case in cases:
        if on_case:
            on_case(case.name)
        names = case_allocators(suite, case, allocators)
        used += [n for n in names if n not in used]
        plan = plan_case(suite, case, checkpoint.tokenizer)
        result = run_case(plan, checkpoint, [n for n in names if n != VLLM], device=device,
                          dtype=dtype, spacy_model=spacy_model, progress=progress,
                          use_cache=use_cache)
        records += [r.as_dict() for r in result.records]
        if VLLM in names:
            from kvdiag.runners.trace import from_plan
            from kvdiag.runners.vllm_audit import vllm_section
            from kvdiag.runners.vllm_replay import replay_vllm

            replay = replay_vllm(from_plan(plan, result.records), api=vllm_api)
            records += [r.as_dict() for r in replay.records]
            vllm_stats[case.name] = vllm_section(replay)
            if progress:
                progress(len(replay.records))
        logs.update({f"{case.name}/{k}": v for k, v in result.engine_log.items()})
        seconds[case.name] = result.seconds
    frame = pd.DataFrame(records)
    summary = summarize(frame)
    summary.update({
        "signature": signature(engine="reference", allocators=used, block_size=suite.block_size,
                               model=model_label(model_dir), suite=suite.name, seed=suite.seed),
        "suite": suite.name,
        "suite_path": str(suite.path),
        "cases": [c.name for c in cases],
        "targets": ["reference"],
        "allocators": used,
        "model": str(model_dir),
        "device": device,
        "engine_log": logs,
        "seconds": seconds,
    })
    if vllm_stats:
        summary["vllm_audit"] = vllm_stats
    summary.update(judge(summary["rounds"], [(c.name, c.ablation) for c in cases]))
    if any(s["corrupted"] for s in vllm_stats.values()):
        summary["verdict"] = FAIL  # vLLM read foreign slots or broke an invariant
    return RunResult(kind, frame, summary, extra={"engine_log": logs})



def reproduce(suite: str, cases: list[str] | None = None, allocators: list[str] | None = None, *,
              model: Path | None = None, device: str = "cpu", dtype: str | None = None,
              spacy_model: str | None = None, out_dir: Path | None = None, kind: str = "reproduce",
              check_integrity: bool = False, use_cache: bool = True, progress=no_progress,
              amend: Callable[[RunResult], None] | None = None) -> RunResult:
    """kvdiag reproduce, start to finish: check allocator names, cases and model before any
    work, begin the run directory, run the suite, let `amend` adjust the result (verify's
    gate), and finish the run directory. `progress`: see kvdiag.lifecycle.no_progress."""
    from kvdiag.runners.reference import workers_setting
    from kvdiag.runs import RunDir, Timer

    timer = Timer()
    allocators = names(allocators)
    for name in allocators or []:
        if name != VLLM:
            check_allocator(name)
    workers_setting()  # a bad KVDIAG_ALLOCATOR_WORKERS fails here, before any work
    loaded, chosen = load_cases(suite, cases)
    if model is not None and not model.is_dir():
        raise KvdiagError(f"--model {model}: not a model directory")
    run_dir = RunDir.begin(out_dir, loaded.name)
    if check_integrity:
        os.environ["KVDIAG_CHECK_INTEGRITY"] = "1"
    with run_dir, progress("running", total_requests(loaded, chosen, allocators)) as update:
        result = run_suite(loaded, chosen, allocators=allocators, model=model, device=device,
                           dtype=dtype, spacy_model=spacy_model, kind=kind, use_cache=use_cache,
                           progress=lambda n: update(advance=n),
                           on_case=lambda name: update(description=f"case {name}"))
    if amend is not None:
        amend(result)
    return finish_run(result, run_dir, timer)


def verify(allocator: str, expect_guard: bool, expect_bug: bool, suite: str,
           case: str | None = None, **options) -> RunResult:
    """kvdiag verify: one case under `allocator` (beside guarded when it is another), its
    verdict replaced by the gate's: --expect-guard (the guard logged and held in every
    round) or --expect-bug (the fault shows), exactly one of them. `options` as `reproduce`
    takes them."""
    if expect_guard == expect_bug:
        raise KvdiagError("give exactly one of --expect-guard or --expect-bug")
    check_allocator(allocator)
    _, (chosen,) = load_cases(suite, case, one=True)

    def gate(result: RunResult) -> None:  # verify's own verdict is the run's, in summary.json too
        found = gate_verdict(result.summary, result.extra["engine_log"], chosen.name, allocator,
                             expect_guard)
        result.summary |= {"gate": found, "run_verdict": result.summary["verdict"],
                           "verdict": "pass" if found["passed"] else "fail"}

    pair = [allocator] if allocator == "guarded" else [allocator, "guarded"]
    return reproduce(suite, [chosen.name], pair, kind="verify", amend=gate, **options)


def probe(suite: str, case: str | None = None, style: str | None = None, *,
          base_url: str | None = None, target: str | None = None, model: str | None = None,
          api_key: str | None = None, settings=None, count_with: str = "tokenize",
          resume: Path | None = None, out_dir: Path | None = None,
          info: Callable[[str], None] = lambda _: None, warn: Callable[[str], None] = lambda _: None,
          progress=no_progress) -> RunResult:
    """kvdiag probe, start to finish: the case, the server (`base_url` serving `model`, or a
    vllm-local `target` started for the run and logging into it), the run directory (new, or
    the interrupted one to `resume`), the probe (kvdiag.runners.probe_run) and the finished
    run directory. A dead server leaves no directory behind."""
    from kvdiag.runners.probe_run import run_probe
    from kvdiag.runs import RunDir, Timer
    from kvdiag.targets import endpoint_target, running

    timer = Timer()
    loaded, (chosen,) = load_cases(suite, case, style, one=True)
    spec = endpoint_target(base_url, target, model)
    run = RunDir.resume(resume) if resume is not None else RunDir.begin(out_dir, f"probe-{loaded.name}")
    with (run, running(spec, loaded, chosen, model, run.path, info) as (live, served),
          progress(f"planning with {live.url}'s tokenizer") as update):
        result = run_probe(live.url, served, loaded, chosen, run.path, api_key=api_key,
                           settings=settings, resume=resume is not None, warn=warn,
                           count_with=count_with,
                           progress=lambda phase, done, total: update(description=phase,
                                                                      completed=done, total=total))
        if spec.is_vllm_local:
            result.summary["target_spec"] = spec.spec
    return finish_run(result, run, timer)
