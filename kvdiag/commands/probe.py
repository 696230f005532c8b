"""kvdiag probe: a live server tested from outside against cache-isolated runs.

    plan     the case; the target (a URL serving `model`, or a local engine kvdiag starts
             for the run); the run directory (new, or the interrupted one to resume)
    measure  kvdiag.runners.live.probe_run.run_probe: records, recycling, ground truth
    judge    kvdiag.verdicts.judge_probe
    finish   ProbeSummary, kvdiag.commands.lifecycle.finish_run

A dead server leaves no directory behind (or keeps what was measured, to --resume).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from kvdiag.commands.lifecycle import finish_run, no_progress
from kvdiag.commands.probe_args import ProbeArgs
from kvdiag.errors import KvdiagError
from kvdiag.planning.suites import Suite, load_cases
from kvdiag.record.evidence import KeyCoverage, ServerBlock
from kvdiag.record.results import RunResult, Signature
from kvdiag.record.summary import ProbeSummary
from kvdiag.runners.live.phases import ISOLATED, SHARED
from kvdiag.runners.live.probe_facts import ProbeRun
from kvdiag.verdicts import (
    Judgement,
    ProbeDetails,
    ProbeEvidence,
    Verdict,
    judge_probe,
    prompt_logprob_departures,
)

SENTINEL_FILE = "sentinel.jsonl"


def sentinel_path(spec, given: str | None,
                  serves_reference: bool = False) -> Path | str | bool | None:
    """Where the run's sentinel writes: True for the run directory (a local engine with a
    sentinel, by default, or `on`), a checked path, the URL a remote server's sentinel serves its file
    at, or None for none. `serves_reference`: a reference:ALLOCATOR target is served by a
    `kvdiag serve` the command starts (the isolation audit), whose sentinel is on by default
    too. KvdiagError (exit 2): a file kvdiag cannot write for a server it starts, or cannot
    read for one it does not; a URL that does not answer as a sentinel."""
    from kvdiag.sentinel.log import check_writable
    from kvdiag.sentinel.serve import fetch, is_url

    reference = serves_reference and spec.is_reference  # a kvdiag serve this command starts
    starts = spec.is_local or reference  # a server kvdiag starts
    if given == "off":
        return None
    if given is None:
        return True if spec.sentinel_default or reference else None
    if given == "on":
        if not (reference or (spec.is_local and spec.engine.sentinel)):
            raise KvdiagError(f"--sentinel on: {spec.spec} has no sentinel kvdiag can start (give "
                              "the file or URL a server's sentinel writes)")
        return True
    if is_url(given):
        if starts:
            raise KvdiagError(f"--sentinel {given}: a server kvdiag starts writes its sentinel to a "
                              "file (give a path); a URL is for a server somebody else runs")
        try:
            fetch(given, timeout=10)
        except OSError as e:
            raise KvdiagError(f"--sentinel {e}") from None
        return given
    try:
        if starts:
            return check_writable(given)
        open(given).close()  # a server somebody else runs writes it: it must be there
        return Path(given)
    except OSError as e:
        raise KvdiagError(f"--sentinel {given}: {e.strerror or e}") from None


def parse_events(spec: str | None) -> tuple[str, ...]:
    """--require's value: events of kvdiag.vocab.EVENTS, comma-separated, or `all` (every
    row of the run's coverage table: the events its engine's traffic drives, kept as
    ("all",) and expanded by the judge); an unknown name is bad input (KvdiagError, exit 2)."""
    from kvdiag.vocab import EVENTS

    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    if names == ["all"]:
        return ("all",)
    unknown = [n for n in names if n not in EVENTS]
    if unknown:
        raise KvdiagError(f"--require: unknown event {', '.join(map(repr, unknown))} (known: "
                          f"{', '.join(EVENTS)}, or all)")
    return tuple(names)


def evidence(run: ProbeRun) -> ProbeEvidence:
    """What the probe measured, raw, as judge_probe reads it: its divergences begin with
    `run.departed`'s rows, in order (judge() writes their labels back)."""
    pool = "unknown" if run.server.num_blocks is None else f"{run.server.num_blocks} blocks"
    departed, pairs, only = run.departed, run.key_coverage.differential, run.traffic.differential_only
    # a --differential-only run's frame is its pairs: each counted once, named by its phase
    where = ["differential" if only else str(int(r)) for r in departed["round"]]
    divergences = [(w, float(m)) for w, m in zip(where, departed["divergence_margin"])]
    divergences += [("differential", p.margin) for p in pairs
                    if not only and p.margin is not None and p.margin == p.margin]
    life = run.lifecycle.divergences
    divergences += [(f"lifecycle {q.group}", q.margin) for q in life if q.margin == q.margin]
    oracle = run.key_coverage.oracle
    return ProbeEvidence(
        divergences=divergences, floor_margins=run.noise_floor.margins,
        numerics_margin=run.noise_floor.numerics_margin, isolated=run.ground_truth.isolated,
        contaminated=run.ground_truth.contaminated, unchecked=run.ground_truth.unchecked,
        isolation=run.traffic.isolation, recycling=run.recycling,
        pool=f"{pool} of {run.server.block_size} tokens, {len(run.pressure)} pressure sessions",
        hits=oracle.hits, oracle=oracle,
        logprob_departures=run.prompt_logprobs.departed,
        answered=len(run.shared) + sum(p.margin is not None for p in pairs) * (not only)
        + len(life),
        requires_recycling=not only,
        topk=run.topk.shifts, topk_floor=run.topk.floor_shifts,
        events=run.lifecycle.events, required=tuple(run.traffic.require),
        sentinel=run.sentinel)


def judge(run: ProbeRun) -> Judgement:
    """judge_probe's verdict, its labels written into the run first to last: the prompt
    logprobs' departures, then each departed answer's class (the frame's classification, the
    first divergences, the by-request windows, the lifecycle requests' classes), so every
    count the run reports follows the judge's one labelling."""
    run.prompt_logprobs = prompt_logprob_departures(run.prompt_logprobs, run.noise_floor.numerics_margin)
    verdict = judge_probe(evidence(run))
    labels = verdict.details.labels
    run.label(labels[:len(run.departed)])
    life = [q for q in run.lifecycle.divergences if q.margin == q.margin]  # evidence()'s last ones
    for q, label in zip(life, labels[len(labels) - len(life):]):
        q.label = label
    return verdict


def summary_fields(run: ProbeRun, suite: Suite, verdict: Judgement, *, model_label: str | None = None,
                   target_spec: str | None = None) -> dict:
    """ProbeSummary's fields (regress builds on them). `model_label`: the model's digest when
    kvdiag started the server itself (its directory's); else the served model's. `verdict`:
    judge_probe's (its details a ProbeDetails)."""
    from kvdiag.metrics.decay import summarize

    details: ProbeDetails = verdict.details

    metrics = summarize(run.frame, baseline=None)  # a live server has no guarded series
    target = run.frame["target"].iloc[0] if len(run.frame) else ""
    where = target_spec or target  # a target kvdiag started is named by its spec, not its port
    signature = Signature(engine=f"{run.engine['name']}-{run.engine['version']}@{where}",
                          allocators=(SHARED, ISOLATED),
                          block_size=run.server.block_size, model=model_label or run.model_label,
                          suite=suite.name, seed=suite.seed)
    return metrics.fields() | {
        "signature": signature.format(), "suite": suite.name, "cases": [run.plan.case.name],
        "style": run.plan.style, "targets": [target], "model": run.model_label.split("@")[0],
        "verdict": verdict.verdict, "reason": verdict.reason,
        "corruption_rounds": run.corruption_rounds,
        "corruption_where": details.where or None,
        # every request that departed decisively, any phase (differential, shared, lifecycle)
        "corrupted_requests": details.corrupted,
        "numerics_requests": details.numerics, "noise_floor": run.noise_floor,
        "isolation": run.traffic.isolation,
        "server_prefix_cache": run.prefix_cache,
        "server": ServerBlock(**run.server.model_dump(), suite_pool=run.plan.schedule.num_blocks,
                              engine=run.engine["name"], engine_version=run.engine["version"]),
        "recycling": run.recycling, "first_divergences": run.first_divergences or None,
        "inconclusive_reason": verdict.reason if verdict.verdict is Verdict.INCONCLUSIVE else None,
        "ground_truth": run.ground_truth, "divergence_by_request": run.by_request,
        "traffic": run.traffic, "prompt_logprobs": run.prompt_logprobs,
        "key_coverage": _key_coverage(run, verdict), "target_spec": target_spec,
        "sessions_file": getattr(run.plan, "user", None),  # --sessions (kvdiag.userdata)
        "events": run.lifecycle.events,
        "lifecycle": run.lifecycle.model_copy(update={"missing": details.events_missing}),
        "sentinel": run.sentinel,
        "topk": run.topk.model_copy(update={"threshold": details.topk_threshold,
                                            "departed": details.topk_departed})}


def _key_coverage(run: ProbeRun, verdict: Judgement) -> KeyCoverage:
    """summary.json's key_coverage: the oracle's counts and the over-hits the judge found (every
    request's bound stays out of the file), and the differential phase's pairs."""
    kc, details = run.key_coverage, verdict.details
    oracle = kc.oracle.model_copy(update={"over_hits": details.over_hits,
                                          "examples": details.over_hit_examples})
    return kc.model_copy(update={"oracle": oracle})


def probe(args: ProbeArgs, *, info: Callable[[str], None] = lambda _: None,
          warn: Callable[[str], None] = lambda _: None, progress=no_progress) -> RunResult:
    """kvdiag probe, start to finish, as `args` asks (kvdiag.commands.probe_args)."""
    from kvdiag.engines.local import running
    from kvdiag.record.rundir import RunDir, Timer
    from kvdiag.runners.live.probe_run import run_probe
    from kvdiag.targets import endpoint_target
    from kvdiag.userdata import command as userdata

    timer = Timer()
    settings = args.settings
    loaded, (chosen,) = load_cases(args.suite, args.case, args.style, one=True)
    # before any server starts
    loaded = userdata.with_sessions(loaded, args.sessions, args.sessions_format)
    spec = endpoint_target(args.base_url, args.target, args.model)
    if args.engine_args and not spec.is_local:
        raise KvdiagError("--engine-arg is for a server kvdiag starts (a *-local target)")
    watch = sentinel_path(spec, args.sentinel)  # bad input: exit 2 before any server starts
    run = (RunDir.resume(args.resume) if args.resume is not None
           else RunDir.begin(args.out_dir, f"probe-{loaded.name}"))
    if watch is True:
        watch = run.path / SENTINEL_FILE
    if watch is not None:
        settings = dataclasses.replace(settings, sentinel=str(watch))
    with (run, running(spec, loaded, chosen, args.model, run.path, info, settings.adapter, watch,
                       args.engine_argv) as served,
          progress(f"planning with {served.url}'s tokenizer") as update):
        if served.prefill_chunk and settings.prefill_chunk is None:
            settings = dataclasses.replace(settings, prefill_chunk=served.prefill_chunk)
        if served.reuse_chunk:
            settings = dataclasses.replace(settings, reuse_chunk=served.reuse_chunk)
        if served.slot_files:
            settings = dataclasses.replace(settings, slot_files=served.slot_files)
        measured = run_probe(served.url, served.model, loaded, chosen, run.path, api_key=args.api_key,
                             settings=settings, resume=args.resume is not None, warn=warn,
                             count_with=args.count_with,
                             progress=lambda phase, done, total: update(description=phase,
                                                                        completed=done, total=total))
    userdata.score(measured)  # the free-text fact check, before the summary reads it
    verdict = judge(measured)
    fields = summary_fields(measured, loaded, verdict, model_label=served.model_label,
                            target_spec=spec.spec if spec.is_local else None)
    if args.engine_argv:
        fields["server"] = fields["server"].model_copy(update={"engine_args": list(args.engine_argv)})
    frame, fields = userdata.finish(measured.frame, fields, run.path, args.no_text)
    return finish_run(RunResult("probe", frame, ProbeSummary(**fields)), run, timer)
