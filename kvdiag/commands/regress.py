"""kvdiag regress: the weekly regression job, one run start to finish.

    serving()   start a local engine's server for the run (other targets pass)
    prepare()   load the suite, parse the target, check every output path is writable,
                build the baseline key and find the baseline -- a key mismatch raises
                KeyMismatch here, before anything runs (its JUnit XML written) -- and
                open the run directory
    measure()   the suite on the reference engine, or the live probe (a fleet's Ray task
                calls it on a worker)
    record()    judge (the run's own ground truth, then the baseline: kvdiag.verdicts),
                finish the run directory (kvdiag.commands.lifecycle.finish_run), write the JUnit
                XML, and only then append the run to the history (one transaction), so
                no history row ever points at an unfinished run

`run()` is them in a row. Returns a RunResult (kind "regress"); the CLI renders it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.commands.lifecycle import no_progress
from kvdiag.errors import KvdiagError
from kvdiag.planning.suites import load_cases
from kvdiag.record.results import RunResult
from kvdiag.record.rundir import RunDir, check_writable
from kvdiag.regress import baselines as B
from kvdiag.regress import history as H
from kvdiag.regress.compare import Tolerances
from kvdiag.regress.keys import BaselineKey, endpoint_key, reference_key
from kvdiag.targets import Target, parse_target
from kvdiag.userdata.command import score as score_sessions
from kvdiag.userdata.command import sessions_digest, with_sessions


@dataclass
class Options:
    suite: str
    target: str
    model: str | None = None
    cases: str | list[str] | None = None  # as kvdiag.planning.suites.names reads them
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
    live_url: str | None = None  # a local engine's server, once started (serving())
    model_label: str | None = None  # its model directory's digest
    attach: list[Path] = field(default_factory=list)  # files copied into the run (server log)
    sentinel: Path | None = None  # the file a local engine's sentinel writes (kvdiag.sentinel)
    sessions: Path | None = None  # a sessions file replayed instead of the suite's (kvdiag.userdata)
    sessions_format: str | None = None


@dataclass
class Prepared:
    suite: object  # kvdiag.planning.suites.Suite
    cases: list
    target: Target
    key: BaselineKey
    baseline: B.Baseline | None
    model_dir: Path | None
    run: RunDir


def run(opts: Options, *, info: Callable[[str], None] = lambda _: None,
        warn: Callable[[str], None] = lambda _: None,
        progress: Callable[..., AbstractContextManager] = no_progress) -> RunResult:
    """serving(), prepare(), measure() and record(): the whole regression run. `warn` is told
    when there is no baseline of the suite and when a live server refused to empty its
    prefix cache; `progress` as kvdiag.commands.lifecycle.no_progress takes it."""
    from kvdiag.commands.regress_record import record
    from kvdiag.record.rundir import Timer

    check_writable(opts.history, "--history")  # before a local engine's server is started too
    check_writable(opts.junit, "--junit")
    with serving(opts, info) as opts:
        p = prepare(opts)
        if p.baseline is None:
            warn(f"{opts.baseline}: no baseline of suite {p.suite.name}; only the run's own "
                 "ground-truth check gates (record one with `kvdiag baseline update RUN_DIR`)")
        with p.run, progress(f"regress {p.target.spec}") as update:
            timer = Timer()
            cold = p.target.is_reference or reset_cache(p, opts)
            result = record(p, opts, measure(p, opts, p.run.path, update), cold, timer)
        if not cold:
            warn(f"{opts.target} refused POST /reset_prefix_cache: the run began on a warm cache, "
                 "so BRAI was not compared with the baseline")
        return result


@contextmanager
def serving(opts: Options, info: Callable[[str], None] = lambda _: None) -> Iterator[Options]:
    """`opts` while its target can be reached: a local engine's server runs on the case the
    run measures (log in a temporary directory, attached to the run); others pass."""
    target = parse_target(opts.target)
    if not target.is_local:
        yield opts
        return
    import tempfile

    from kvdiag.engines.local import running

    suite, (case,) = load_cases(opts.suite, opts.cases, one=True)
    suite = with_sessions(suite, opts.sessions, opts.sessions_format)
    logs = Path(tempfile.mkdtemp(prefix=f"kvdiag-{target.engine.name}-"))
    watch = logs / "sentinel.jsonl" if target.sentinel_default else None  # on by default
    with running(target, suite, case, opts.model, logs, info, sentinel=watch) as served:
        yield dataclasses.replace(opts, live_url=served.url, model=served.model, cases=case.name,
                                  model_label=served.model_label, sentinel=watch,
                                  attach=[logs / target.engine.log_name, *([watch] if watch else [])])


def prepare(opts: Options) -> Prepared:
    from kvdiag.paths import CANARY

    suite, cases = load_cases(opts.suite, opts.cases)
    suite = with_sessions(suite, opts.sessions, opts.sessions_format)
    target = parse_target(opts.target)
    if suite.sessions:  # the file's contents, not only its name, key the baseline
        if target.is_reference:
            raise KvdiagError(f"--target {target.spec}: a sessions file is replayed against a live "
                              "server (a URL, vllm-local, sglang-local)")
        opts = dataclasses.replace(opts, flags=opts.flags | {"sessions": sessions_digest(suite.sessions)})
    if target.is_local:
        if not opts.live_url:
            raise KvdiagError(f"--target {target.spec}: its server is not running (start it with "
                              "kvdiag.commands.regress.serving)")
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


def measure(p: Prepared, opts: Options, run_dir: Path, progress: Callable[..., None]):
    """What the run measured: a kvdiag.commands.reproduce.Measured (reference engine) or a
    kvdiag.runners.live.probe_run.ProbeRun (a live server)."""
    if p.target.is_reference:
        from kvdiag.commands.lifecycle import forwarding
        from kvdiag.commands.reproduce import measure as measure_suite

        return measure_suite(p.suite, p.cases, allocators=[p.target.allocator], model=p.model_dir,
                             device=opts.device, dtype=opts.dtype, progress=forwarding(progress))
    from kvdiag.runners.live.phases import ProbeSettings
    from kvdiag.runners.live.probe_run import run_probe

    measured = run_probe(p.target.url, opts.model, p.suite, p.cases[0], run_dir, api_key=opts.api_key,
                         settings=ProbeSettings(concurrency=opts.concurrency,
                                                sentinel=str(opts.sentinel) if opts.sentinel else None),
                         progress=lambda phase, done, total: progress(description=phase,
                                                                       completed=done, total=total))
    score_sessions(measured)  # a sessions file's free-text fact check (kvdiag.userdata)
    return measured


def reset_cache(p: Prepared, opts: Options) -> bool:
    """Empty a live server's prefix cache (POST /reset_prefix_cache) so block reuse is
    measured from a cold cache, as the baseline's was; False when the server refuses."""
    from kvdiag.runners.live.endpoint import Endpoint

    endpoint = Endpoint(p.target.url, opts.model, opts.api_key, retries=1)
    try:
        return endpoint.reset_prefix_cache()
    except KvdiagError:
        return False
    finally:
        endpoint.sync.close()
