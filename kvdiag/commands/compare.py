"""kvdiag compare: two or more targets (two engine versions, or one with and one without a
patch) probed on the same sessions, one after the other, each judged against its own isolated
twin, never against the other engine's numerics; one page draws their decay curves together.

    plan     every target parsed, the suite and the sessions file checked, before any server
    measure  kvdiag.commands.probe.probe per target, each into its own run directory
             RUN/<n>-<target>/ (its own report.html, summary.json, results.parquet)
    judge    kvdiag.verdicts.judge_compare: the worst of the targets' own verdicts
    finish   CompareSummary (summary.json), results.parquet (the per-round figures of every
             target's shared series) and report.html (kvdiag.report.compare), then committed

Built on the probe directly, not on the fleet (kvdiag.fleet): a fleet cell is a regression
run, which needs a baseline and a history and runs under Ray; an upgrade comparison needs
neither, only each target's own probe verdict and its per-round figures. A target that cannot
be measured (a dead server, an engine that does not start) is an error row; the others run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kvdiag.commands.lifecycle import no_progress
from kvdiag.commands.probe_args import ProbeArgs
from kvdiag.errors import KvdiagError
from kvdiag.record.results import RunResult
from kvdiag.record.summary_rows import CompareTarget, RoundRow

SHARED = "shared"  # kvdiag.runners.live.phases.SHARED: the series the page draws


class Endpoint(NamedTuple):
    """One target as kvdiag.commands.probe.probe takes it: a URL, or a local engine's spec."""

    spec: str
    base_url: str | None
    target: str | None


def endpoints(targets: list[str], model: str | None) -> list[Endpoint]:
    """Every target checked before any work (KvdiagError, exit 2): an http(s) URL (served
    `model`), vllm-local[:FAULT] or sglang-local[:FAULT]; two at least."""
    from kvdiag.targets import check_url, parse_target

    if len(targets) < 2:
        raise KvdiagError("kvdiag compare needs two targets or more (--target A --target B)")
    out = []
    for spec in targets:
        parsed = parse_target(spec)
        if parsed.is_reference:
            raise KvdiagError(f"--target {spec}: compare probes live servers; serve the reference "
                              f"engine with `kvdiag serve --allocator {parsed.allocator}` and give "
                              "its URL")
        if parsed.is_local:
            out.append(Endpoint(parsed.spec, None, parsed.spec))
        elif not model:
            raise KvdiagError(f"--target {spec}: a URL needs --model NAME (as the server serves it)")
        else:
            out.append(Endpoint(parsed.spec, check_url(parsed.spec, "--target"), None))
    return out


def run_name(index: int, spec: str) -> str:
    """A target's run directory inside the comparison's: `2-vllm-local-stale-hash`."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", re.sub(r"^https?://", "", spec)).strip("-")
    return f"{index}-{slug}"[:80]


def compare(targets: list[str], args: ProbeArgs, *, out_dir: Path | None = None,
            info: Callable[[str], None] = lambda _: None, warn: Callable[[str], None] = lambda _: None,
            progress=no_progress) -> RunResult:
    """kvdiag compare, start to finish (see the module docstring): `args` is the probe every
    target gets (its target and run directory set per target)."""
    from kvdiag.commands.lifecycle import stamp
    from kvdiag.commands.probe import probe
    from kvdiag.planning.suites import load_cases
    from kvdiag.record.rundir import RunDir, Timer, write_run
    from kvdiag.userdata import command as userdata

    timer = Timer()
    ends = endpoints(targets, args.model)
    loaded, (chosen,) = load_cases(args.suite, args.case, None, one=True)
    # before any server starts
    loaded = userdata.with_sessions(loaded, args.sessions, args.sessions_format)
    run = RunDir.begin(out_dir, f"compare-{loaded.name}")
    rows = []
    with run:
        for i, end in enumerate(ends, 1):
            info(f"target {i}/{len(ends)}: {end.spec}")
            sub = run.path / run_name(i, end.spec)
            one = dataclasses.replace(args, case=chosen.name, base_url=end.base_url,
                                      target=end.target, out_dir=sub)
            rows.append(_probe_one(probe, end, one, info=info, warn=warn, progress=progress))
        summary = compare_summary(rows, loaded, args.model)
        stamp(summary, timer)
        frame = _frame(summary)
        write_run(run.path, frame, summary)
        from kvdiag.report.compare import page

        (run.path / "report.html").write_text(page(summary), encoding="utf-8")
    result = RunResult("compare", frame, summary)
    result.run_dir = run.commit()
    return result


def _probe_one(probe, end: Endpoint, args: ProbeArgs, **options) -> tuple[CompareTarget, list[RoundRow]]:
    """One target's probe, as the comparison records it: the target's row and its shared
    rounds; a target that could not be measured is judged unmeasured (an error), its reason
    the error's first line."""
    from kvdiag.verdicts import judge_unmeasured
    from reference_engine.errors import EngineError

    try:
        res = probe(args, **options)
    except (KvdiagError, EngineError) as e:
        judged = judge_unmeasured((str(e).splitlines() or [type(e).__name__])[0])
        kept = args.out_dir.name if args.out_dir.is_dir() else None
        return CompareTarget(target=end.spec, verdict=judged.verdict, reason=judged.reason,
                             run_dir=kept), []
    s = res.summary
    shared = [r.model_copy(update={"target": end.spec}) for r in s.rounds if r.allocator == SHARED]
    sqdr = next((v for v in s.sqdr.values() if v is not None), None)
    return CompareTarget(target=end.spec, verdict=s.verdict, reason=s.reason,
                         run_dir=args.out_dir.name, signature=s.signature, sqdr=sqdr,
                         first_corruption_round=min(s.corruption_rounds, default=None)), shared


def compare_summary(rows: list[tuple[CompareTarget, list[RoundRow]]], suite, model: str | None):
    """The CompareSummary of the targets' rows, its verdict decided by judge_compare."""
    from kvdiag.metrics.bleu import bleu_signature
    from kvdiag.record.results import Signature
    from kvdiag.record.summary import CompareSummary
    from kvdiag.verdicts import judge_compare

    targets = [t for t, _ in rows]
    judged = judge_compare((t.target, t.verdict) for t in targets)
    first = next((t.signature for t in targets if t.signature), None)
    parts = dict(p.split(":", 1) for p in first.split("|")) if first else {}
    signature = Signature(engine="compare:" + "+".join(t.target for t in targets),
                          allocators=(SHARED, "isolated"),
                          block_size=int(parts.get("bs", suite.block_size)),
                          model=parts.get("model", model or suite.model or "canary"),
                          suite=suite.name, seed=suite.seed)
    return CompareSummary(
        signature=signature.format(), suite=suite.name, verdict=judged.verdict, reason=judged.reason,
        sessions_file=Path(suite.sessions).name if suite.sessions else None, targets=targets,
        rounds=[row for _, rounds in rows for row in rounds],
        sqdr={t.target: t.sqdr for t in targets}, bleu_signature=bleu_signature())


def _frame(summary):
    """results.parquet of a comparison: one row per target and round of its shared series."""
    import pandas as pd

    columns = ["target", "round", "sessions", "bleu4", "fact_check_pass_rate", "diverged_sessions"]
    return pd.DataFrame([{c: getattr(r, c) for c in columns} for r in summary.rounds], columns=columns)
