"""kvdiag sentinel: read the file a sentinel inside a server wrote (docs/sentinel.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import JsonOpt, Output, handle_errors


@handle_errors
def sentinel(
    path: Annotated[str, typer.Argument(metavar="FILE", help="The sentinel's file (KVDIAG_SENTINEL "
                                        "of a vLLM or SGLang with kvdiag's plugin, or kvdiag serve "
                                        "--sentinel), or the URL its plugin serves it at "
                                        "(KVDIAG_SENTINEL_ADDR).")],
    since: Annotated[int, typer.Option("--since", min=0, help="Read from this byte on (the file's "
                                       "size when your traffic began).")] = 0,
    prom: Annotated[Path | None, typer.Option("--prom", show_default=False, help="Also write its "
                                              "counters as a Prometheus textfile "
                                              "(kvdiag_sentinel_*_total).")] = None,
    show: Annotated[int, typer.Option("--show", min=0, help="Findings to print.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """What a sentinel checked and every bad KV read it saw: steps, requests and slot reads
    checked; foreign, unwritten and overwritten reads with the request, positions, writer,
    step and event of each. Exit 0: reads checked, none bad; 1: bad reads; 2: no file, or
    nothing checked (no evidence).

    Example: kvdiag sentinel sentinel.jsonl --prom textfile/kvdiag.prom
    Example: kvdiag sentinel http://staging:9477/
    """
    from kvdiag.runners.live.sentinel import observe
    from kvdiag.verdicts import judge_sentinel

    out = Output(as_json)
    block, _ = observe(path, since, wait=0)
    judged = judge_sentinel(block)
    if prom is not None:
        write_prom(block, prom)
    lines = [f"{judged.verdict.value.upper()} {judged.reason}"]
    if block.leaked:  # what the wrong slots drew (weighed where the engine's hooks could)
        largest = "unmeasured" if block.leakage_largest is None else f"{block.leakage_largest:.4f}"
        unweighed = f" ({block.leakage_unweighed} could not be weighed)" if block.leakage_unweighed else ""
        lines.append(f"  attention leakage: {block.leaked} requests attended to slots read wrong"
                     f"{unweighed}; the largest, per sampled token: {largest}")
    for f in block.findings[:show]:
        span = ", ".join(f"{a}-{b - 1}" for a, b in f.positions[:3])
        lines.append(f"  step {f.step} {f.kind:9} {f.request} positions {span} ({f.count} of "
                     f"{f.context_len}) writer {', '.join(f.writers) or '-'} "
                     f"[{'; '.join(f.context + f.writer_context)}]")
    out.show({"verdict": judged.verdict.value, "reason": judged.reason} | block.model_dump(), *lines)
    raise typer.Exit(judged.verdict.exit_code)


def write_prom(block, path: Path) -> None:
    """The counters as a Prometheus textfile (node exporter's textfile collector)."""
    from prometheus_client import CollectorRegistry, Counter, write_to_textfile

    registry = CollectorRegistry()
    engine = block.engine or "unknown"
    for name, value, doc in (("steps", block.steps, "scheduling steps checked"),
                             ("requests", block.requests, "requests checked"),
                             ("reads", block.reads, "KV slot reads checked")):
        Counter(f"kvdiag_sentinel_{name}", doc, ["engine"], registry=registry).labels(engine).inc(value)
    bad = Counter("kvdiag_sentinel_bad_reads", "KV slot reads of another prefix's K/V (foreign), "
                  "of nobody's (unwritten), or overwritten under a live request", ["engine", "kind"],
                  registry=registry)
    for kind in ("foreign", "unwritten", "overwrite"):
        bad.labels(engine, kind).inc(getattr(block, kind))
    write_to_textfile(str(path), registry)
