"""kvdiag detect: the detection matrix, healthy and every planted fault, model-free and live."""

from __future__ import annotations

from typing import Annotated

import typer

from kvdiag.cli.common import JsonOpt, OneCaseOpt, OutOpt, Output, handle_errors

ListOpt = Annotated[list[str] | None, typer.Option(
    "--faults", show_default=False, help="Faults to plant, repeated or comma-separated (default: "
    "all of the engine's catalog; healthy always runs first).")]


@handle_errors
def detect(
    engine: Annotated[str, typer.Option("--engine", help="vllm, sglang or llamacpp (llama.cpp "
                                        "has no model-free audit: --paths live).")] = "vllm",
    faults: ListOpt = None,
    paths: Annotated[str, typer.Option("--paths", help="audit (model-free, vLLM's own allocator "
                                       "in-process: seconds a fault), live (a real server per "
                                       "fault: minutes each on CPU), or audit,live.")] = "audit",
    suite: Annotated[str, typer.Option("--suite", help="Suite YAML file or bundled suite name.")] = "smoke",
    case: OneCaseOpt = None,
    list_faults: Annotated[bool, typer.Option("--list", help="Print the engine's fault catalog "
                                              "(class, real reports, how it is run live) and exit.")] = False,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show, fault by fault, what kvdiag catches: a healthy engine and every fault of its
    catalog (each one re-creating real reported bugs), through the model-free audit and,
    with --paths live, through a real server kvdiag starts with the fault planted. One row
    per fault and path: verdict against the one expected, corrupted requests, the first
    round, requests until the first corruption, numerics, wall time. Writes the matrix into
    a run directory (results.parquet, summary.json, report.html).

    Exit code: 0 healthy passed and every fault gave its expected verdict; 1 a fault went
    uncaught or healthy did not pass (a false positive); 2 bad input (an unknown fault exits
    before any server starts), or a row proved nothing.

    Example: .venv-vllm/bin/kvdiag detect --faults partial-hash,double-free

    Example: kvdiag detect --paths live --faults stale-hash
    """
    out = Output(as_json)
    if list_faults:
        from kvdiag.engines.spec import engine_spec

        rows = [{"fault": f.name, "class": f.fault_class, "effects": list(f.effects), "live": f.live,
                 "reports": list(f.reports), "summary": f.summary}
                for f in engine_spec(engine, "--engine").catalog().values()]
        out.show(rows, *(f"{r['fault']:24} {r['class']} ({', '.join(r['effects'])}; live: {r['live']})\n"
                         f"{'':24} {'; '.join(r['reports'])}" for r in rows))
        return
    from kvdiag.commands.detect import detect as run

    out.finish(run(engine, faults, [p for p in paths.split(",") if p], suite, case,
                   out_dir=out_dir, info=out.info, progress=out.progress))
