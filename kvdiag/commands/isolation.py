"""kvdiag isolation: the tenant-isolation audit, start to finish.

    plan     the endpoint (a URL, or a target kvdiag starts for the audit and stops after
             it); the run directory (an unwritable --out or --history fails before traffic)
    measure  kvdiag.runners.live.isolation.run_isolation
    judge    kvdiag.verdicts.judge_isolation
    finish   IsolationSummary, the isolation page, then the history row
"""

from __future__ import annotations

from pathlib import Path

from kvdiag.commands.lifecycle import no_progress
from kvdiag.record.isolation_rows import IsolationBlock, IsolationCell
from kvdiag.record.results import RunExtras, RunResult, Signature
from kvdiag.record.summary import IsolationSummary
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.isolation import IsolationResult, run_isolation
from kvdiag.runners.live.isolation_plan import IsolationPlan
from kvdiag.verdicts import Judgement, judge_isolation

SENTINEL_FILE = "sentinel.jsonl"  # beside the server's log, where kvdiag starts the server
ROW_COLUMNS = ["config", "length", "trial", "role", "ttft_s", "cached_tokens"]


def audit_target(base_url: str | None, target: str | None, model: str | None,
                 api_key: str | None, plan: IsolationPlan, *, info=lambda _m: None,
                 sentinel: str | None = None, **options) -> RunResult:
    """The audit of --base-url URL (--model: its served name), or of a --target that kvdiag
    starts for the audit and stops after it: reference:ALLOCATOR (`kvdiag serve`, serving
    the plan's adapter name too) or a local engine (--model: a model directory, default the
    canary). `sentinel`: --sentinel's value (a sentinel inside the server: on by default where
    kvdiag starts one). `options`: as audit_isolation takes them."""
    import tempfile

    from kvdiag.commands.probe import sentinel_path
    from kvdiag.engines.local import adapter_dirs, live
    from kvdiag.errors import KvdiagError
    from kvdiag.paths import CANARY
    from kvdiag.record.rundir import check_writable
    from kvdiag.targets import Target, check_url, parse_target

    check_writable(options.get("history"), "--history")  # before a server is started for it
    if (base_url is None) == (target is None):
        raise KvdiagError("give --base-url URL --model NAME, or --target reference:ALLOCATOR / "
                          "vllm-local[:FAULT] / sglang-local[:FAULT]")
    spec = parse_target(target) if target else Target(check_url(base_url, "--base-url"), url=base_url)
    watch = sentinel_path(spec, sentinel, serves_reference=True)  # bad input: exit 2 here
    if spec.url is not None:
        if not model:
            raise KvdiagError(f"{spec.url}: --model NAME (as the server serves it) is required")
        return audit_isolation(spec.url, model, api_key, plan, sentinel=watch, **options)
    model_dir = Path(model or CANARY)
    if not model_dir.is_dir():
        raise KvdiagError(f"--model {model_dir}: not a model directory")
    logs = Path(tempfile.mkdtemp(prefix="kvdiag-isolation-"))
    info(f"starting {spec.spec} (log in {logs}) ...")
    if watch is True:
        watch = logs / SENTINEL_FILE
    names = ("--lora-modules", plan.adapter) if plan.adapter else ()  # kvdiag serve: names only
    served_adapters = adapter_dirs(plan.adapter, model_dir) if spec.is_local else None
    with live(spec, None, None, model_dir, logs, serve_reference=True, serve_args=names,
              adapters=served_adapters, sentinel=watch) as served:
        return audit_isolation(served.url, served.model, api_key, plan, sentinel=watch,
                               model_label=served.model_label, **options)


def audit_isolation(base_url: str, model: str, api_key: str | None, plan: IsolationPlan, *,
                    block_size: int | None = None, out_dir: Path | None = None,
                    history: Path | None = None, model_label: str | None = None,
                    sentinel: Path | str | None = None, progress=no_progress) -> RunResult:
    """The audit of `base_url` in a finished run directory; `extra.isolation` holds what the
    terminal renderer reads. `sentinel`: the file (or URL) a sentinel inside the server
    writes, read from where the audit begins and judged with the cells. `progress`:
    kvdiag.commands.lifecycle.no_progress's."""
    import pandas as pd

    from kvdiag.commands.lifecycle import finish_run
    from kvdiag.record.rundir import RunDir, Timer, check_writable
    from kvdiag.regress import history as H
    from kvdiag.runners.live.sentinel import observe
    from kvdiag.sentinel.log import size_of

    timer = Timer()
    check_writable(history, "--history")
    ep = Endpoint(base_url, model, api_key, timeout=120.0, retries=2)
    since = size_of(sentinel) if sentinel is not None else 0
    with RunDir.begin(out_dir, "isolation") as run:
        try:
            with progress("isolation") as update:
                result = run_isolation(ep, plan, block_size=block_size, progress=lambda done, total:
                                       update(completed=done, total=total))
            label, who = model_label or ep.model_label(), ep.identity()
        finally:
            ep.sync.close()
        watched = None if sentinel is None else observe(sentinel, since)[0]
        verdict = judge_isolation(result.cells, result.plan, result.error, watched)
        summary = IsolationSummary(**isolation_fields(result, verdict, base_url=base_url,
                                                      model=model, model_label=label,
                                                      engine=f"{who['name']}-{who['version']}"),
                                   sentinel=watched)
        frame = pd.DataFrame(result.rows, columns=ROW_COLUMNS)
        done = finish_run(RunResult("isolation", frame, summary,
                                    extra=RunExtras(isolation=result, judgement=verdict)), run, timer)
    if history is not None:  # after the run directory is complete, as regress does
        H.append_isolation(history, done.summary, done.run_dir)
    return done


def isolation_fields(result: IsolationResult, verdict: Judgement, *, base_url: str, model: str,
                     model_label: str, engine: str = "endpoint") -> dict:
    """IsolationSummary's fields: the shared ones (signature, suite, verdict, rounds) plus the
    `isolation` block the renderers read, its cells as the judge flagged them."""
    sig = Signature(engine=engine, allocators=("isolation",),
                    block_size=result.server.block_size, model=model_label, suite="isolation",
                    seed=result.plan.seed)
    cells: list[IsolationCell] = verdict.details.cells
    return {
        "signature": sig.format(), "suite": "isolation", "verdict": verdict.verdict,
        "reason": verdict.reason, "target": base_url, "model": model, "rounds": [], "sqdr": {},
        "brai": {}, "requests": result.requests, "leaks": verdict.details.leaks,
        "isolation": IsolationBlock(server=result.server, plan=result.plan, cells=cells,
                                    exposure_leaks=any(c.leaks for c in cells
                                                       if c.config == "no-salt"))}
