"""One regression run, start to finish (what `kvdiag regress` does), as library calls:

    serving()   start a vllm-local target's server for the run (other targets pass)
    prepare()   load the suite, parse the target, check every output path is writable,
                build the baseline key and find the baseline -- a key mismatch raises
                KeyMismatch here, before anything runs (its JUnit XML written) -- and
                open the run directory
    execute()   run the suite (reference engine or live probe), measure the series under
                test, compare with the baseline, finish the run directory (results,
                summary, report with the trend: kvdiag.lifecycle.finish_run), write the
                JUnit XML, and only then append the run to the history (one transaction),
                so no history row ever points at an unfinished run

`run()` is the three in a row, as `kvdiag regress` does them. Returns data; the CLI renders
it and chooses the exit code.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.lifecycle import no_progress
from kvdiag.regress import baselines as B
from kvdiag.regress import history as H
from kvdiag.regress.compare import Check, Tolerances, compare, ground_truth, regressed_rounds
from kvdiag.regress.keys import BaselineKey, endpoint_key, reference_key
from kvdiag.runs import RunDir, check_writable
from kvdiag.suites import load_cases
from kvdiag.targets import Target, parse_target, running


@dataclass
class Options:
    suite: str
    target: str
    model: str | None = None
    cases: str | list[str] | None = None  # as kvdiag.suites.names reads them
    baseline: Path = B.DEFAULT_PATH
    history: Path = H.DEFAULT_PATH
    junit: Path | None = None
    out: Path | None = None
    tolerances: Tolerances = field(default_factory=Tolerances)
    device: str = "cpu"
    dtype: str | None = None
    api_key: str | None = None
    flags: dict = field(default_factory=dict)
    concurrency: int = 16
    live_url: str | None = None  # a vllm-local target's server, once started (targets.live)
    attach: list[Path] = field(default_factory=list)  # files copied into the run (server log)


@dataclass
class Prepared:
    suite: object  # kvdiag.suites.Suite
    cases: list
    target: Target
    key: BaselineKey
    baseline: B.Baseline | None
    model_dir: Path | None
    run: RunDir


@dataclass
class Result:
    run_dir: Path
    run_id: str
    summary: dict
    verdict: str
    checks: list[Check]
    baseline: B.Baseline | None
    regressed: dict[str, list[int]]
    report: Path
    junit: Path | None
    kind: str = "regress"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "pass" else 1

    def as_json(self) -> dict:
        """What `kvdiag regress --json` prints: the verdict, the run and the comparison."""
        return {"verdict": self.verdict, "run_dir": str(self.run_dir),
                "cold_cache": self.summary.get("cold_cache"), **self.summary["regress"]}


def run(opts: Options, *, info: Callable[[str], None] = lambda _: None,
        warn: Callable[[str], None] = lambda _: None,
        progress: Callable[..., AbstractContextManager] = no_progress) -> Result:
    """serving(), prepare() and execute(): the whole regression run. `warn` is told when there
    is no baseline of the suite and when a live server refused to empty its prefix cache;
    `progress` as kvdiag.lifecycle.no_progress takes it."""
    check_writable(opts.history, "--history")  # before a vllm-local server is started too
    check_writable(opts.junit, "--junit")
    with serving(opts, info) as opts:
        p = prepare(opts)
        if p.baseline is None:
            warn(f"{opts.baseline}: no baseline of suite {p.suite.name}; only the run's own "
                 "ground-truth check gates (record one with `kvdiag baseline update RUN_DIR`)")
        with p.run, progress(f"regress {p.target.spec}") as update:
            result = execute(p, opts, progress=update)
        if not result.summary.get("cold_cache", True):
            warn(f"{opts.target} refused POST /reset_prefix_cache: the run began on a warm cache, "
                 "so BRAI was not compared with the baseline")
        return result


@contextmanager
def serving(opts: Options, info: Callable[[str], None] = lambda _: None) -> Iterator[Options]:
    """`opts` while its target can be reached: a vllm-local target's server runs on the case
    the run measures (log in a temporary directory, attached to the run); others pass."""
    target = parse_target(opts.target)
    if not target.is_vllm_local:
        yield opts
        return
    import tempfile

    suite, (case,) = load_cases(opts.suite, opts.cases, one=True)
    logs = Path(tempfile.mkdtemp(prefix="kvdiag-vllm-"))
    with running(target, suite, case, opts.model, logs, info) as (started, served):
        yield dataclasses.replace(opts, live_url=started.url, model=served, cases=case.name,
                                  attach=[logs / "vllm.log"])


def prepare(opts: Options) -> Prepared:
    from kvdiag.paths import CANARY

    suite, cases = load_cases(opts.suite, opts.cases)
    target = parse_target(opts.target)
    if target.is_vllm_local:
        if not opts.live_url:
            raise KvdiagError(f"--target {target.spec}: its server is not running (start it with "
                              "kvdiag.targets.live)")
        target = dataclasses.replace(target, url=opts.live_url)
    if target.is_reference:
        model_dir = Path(opts.model or suite.model or CANARY)
        if not model_dir.is_dir():
            raise KvdiagError(f"--model {model_dir}: not a model directory")
        key = reference_key(suite, model_dir, opts.device, opts.dtype, opts.flags)
    else:
        model_dir = None
        if not opts.model:
            raise KvdiagError(f"--target {target.url}: --model NAME (as the server serves it) is required")
        if len(cases) > 1:
            raise KvdiagError(f"--target {target.url}: a live server runs one case at a time "
                              f"(give --case, one of: {', '.join(c.name for c in cases)})")
        key = endpoint_key(suite, target.url, opts.model, opts.api_key, opts.flags)
    check_writable(opts.history, "--history")
    check_writable(opts.junit, "--junit")
    try:
        baseline = B.find(opts.baseline, key, [c.name for c in cases])
    except B.KeyMismatch as e:
        if opts.junit is not None:
            from kvdiag.regress.junit import junit_xml, write_junit

            write_junit(opts.junit, junit_xml(e.key.suite, opts.target, [], error=str(e), properties={
                "key_id": e.key.id, "baseline_key_id": e.nearest.id}))
        raise
    run = RunDir.begin(opts.out, f"regress-{suite.name}")
    return Prepared(suite, cases, target, key, baseline, model_dir, run)


def _run(p: Prepared, opts: Options, run_dir: Path, progress: Callable[..., None]):
    if p.target.is_reference:
        from kvdiag.pipeline import run_suite, total_requests

        names = [p.target.allocator]
        progress(total=total_requests(p.suite, p.cases, names), completed=0)
        return run_suite(p.suite, p.cases, allocators=names, model=p.model_dir, device=opts.device,
                         dtype=opts.dtype, progress=lambda n: progress(advance=n),
                         on_case=lambda name: progress(description=f"case {name}"), kind="regress")
    from kvdiag.runners.probe import ProbeSettings
    from kvdiag.runners.probe_run import run_probe

    return run_probe(p.target.url, opts.model, p.suite, p.cases[0], run_dir, api_key=opts.api_key,
                     settings=ProbeSettings(concurrency=opts.concurrency),
                     progress=lambda phase, done, total: progress(description=phase, completed=done,
                                                                   total=total))


def _reset_cache(p: Prepared, opts: Options) -> bool:
    """Empty a live server's prefix cache (POST /reset_prefix_cache) so block reuse is
    measured from a cold cache, as the baseline's was; False when the server refuses."""
    from kvdiag.runners.endpoint import Endpoint

    endpoint = Endpoint(p.target.url, opts.model, opts.api_key, retries=1)
    try:
        return endpoint.reset_prefix_cache()
    except KvdiagError:
        return False
    finally:
        endpoint.sync.close()


def execute(p: Prepared, opts: Options, progress: Callable[..., None] = lambda **_: None) -> Result:
    from kvdiag.runs import Timer

    timer = Timer()
    cold = p.target.is_reference or _reset_cache(p, opts)
    return record(p, opts, _run(p, opts, p.run.path, progress), cold, timer)


def record(p: Prepared, opts: Options, result, cold: bool, timer) -> Result:
    """execute()'s second half, from what was measured (`result`, a RunResult; `cold`: the
    server's prefix cache was emptied first) to the finished run directory and history row.
    A fleet's driver calls it with what a Ray task measured elsewhere."""
    from kvdiag.lifecycle import finish_run
    from kvdiag.regress.measure import brai_against, main_case, measure
    from kvdiag.runs import write_run

    result.kind = "regress"
    frame, summary = result.frame, result.summary | {"cold_cache": cold}
    write_run(p.run.path, frame, summary)  # what was measured is on disk before anything else

    measured = measure(frame, p.target.allocator)
    base = p.baseline.measurement if p.baseline else None
    checks = ground_truth(summary, p.target.allocator)
    if base is not None:
        # block reuse from a warm cache (earlier runs, other traffic) is no anomaly
        checks += compare(measured, base, opts.tolerances, skip=() if cold else ("brai",),
                          per_round_brai=p.target.is_reference)
    brais = brai_against(measured, base)
    verdict = "pass" if all(c.passed for c in checks) else "fail"
    main = main_case(measured)
    run_id = H.unique_run_id(opts.history, p.run.final.resolve().name)
    for case, b in brais.items():
        if not cold:  # a warm cache's reuse says nothing: publish no BRAI rather than a false one
            b["brai"], b["rounds"] = None, {}
        elif base is None:  # no baseline: the in-run guarded series' reuse, when there is one
            b["brai"] = summary.get("by_case", {}).get(case, {}).get("brai", {}).get(
                measured[case]["series"])
    run_brai = brais[main]["brai"]
    summary["regress"] = {
        "run_id": run_id, "target": p.target.spec, "verdict": verdict, "key": p.key.as_dict(),
        "key_id": p.key.id, "tolerances": opts.tolerances.as_dict(), "measurement": measured,
        "brai": {c: b["brai"] for c, b in brais.items()},
        "baseline": None if p.baseline is None else {
            "path": str(opts.baseline), "run_id": p.baseline.run_id, "target": p.baseline.target,
            "created": p.baseline.created, "key_id": p.baseline.key.id},
        "regressed": regressed_rounds([c for c in checks if c.metric != "ground_truth"]),
        "ground_truth_failures": [c.message for c in checks if c.metric == "ground_truth" and not c.passed],
        "failed_checks": [c.as_dict() for c in checks if not c.passed],
    }
    result.summary = summary
    row = {}  # the history row, filled once finish_run has stamped the summary

    def trend(stamped: dict):
        import pandas as pd

        past = (H.runs(opts.history, suite=p.suite.name, last=51) if Path(opts.history).is_file()
                else pd.DataFrame())  # the first run of a new history
        row.update(_history_row(p, run_id, stamped, main, verdict, run_brai))
        return pd.concat([past, pd.DataFrame([row])], ignore_index=True)

    finish_run(result, p.run, timer, history=trend,
               before_report=lambda d: [shutil.copy(f, d / Path(f).name) for f in opts.attach
                                        if Path(f).is_file()])
    run_dir = result.run_dir
    row["run_dir"] = str(run_dir.resolve())
    rounds = [{"case": case, **r, "brai": brais[case]["rounds"].get(r["round"])}
              for case, cm in measured.items() for r in cm["rounds"]]
    if base is None and p.target.allocator and p.target.allocator.startswith("guarded"):
        rounds = [{**r, "brai": 0.0} for r in rounds]  # the guard is its own expected reuse

    junit = None
    if opts.junit is not None:
        from kvdiag.regress.junit import junit_xml, write_junit

        props = {"signature": summary.get("signature"), "key_id": p.key.id,
                 "baseline": p.baseline.run_id if p.baseline else "(none)", "run_dir": str(run_dir)}
        junit = write_junit(opts.junit, junit_xml(p.suite.name, p.target.spec,
                                                  [c.as_dict() for c in checks],
                                                  seconds=timer.seconds, properties=props))
    H.append(opts.history, row, rounds, [c.as_dict() for c in checks if not c.passed])  # last
    return Result(run_dir, run_id, result.summary, verdict, checks, p.baseline,
                  summary["regress"]["regressed"], run_dir / "report.html", junit)


def _history_row(p: Prepared, run_id: str, summary: dict, main: str, verdict: str,
                 run_brai) -> dict:
    """The history's `runs` row of a finished, stamped run."""
    from kvdiag import __version__

    m = summary["regress"]["measurement"][main]
    return {"run_id": run_id, "created": summary["created"], "suite": p.suite.name,
            "target": p.target.spec, "series": m["series"], "engine": p.key.engine,
            "engine_version": p.key.engine_version, "model": p.key.model, "key_id": p.key.id,
            "key_json": json.dumps(p.key.as_dict(), sort_keys=True),
            "baseline_key_id": p.baseline.key.id if p.baseline else None,
            "signature": summary.get("signature"), "verdict": verdict,
            "run_verdict": summary.get("verdict"), "main_case": main, "sqdr": m["sqdr"],
            "brai": run_brai, "block_reuse_rate": m["block_reuse_rate"],
            "attention_leakage": m["attention_leakage"], "divergence_ratio": m["divergence_ratio"],
            "wall_seconds": summary["wall_seconds"], "run_dir": str(p.run.final.resolve()),
            "command": summary["command"], "kvdiag_version": __version__}

