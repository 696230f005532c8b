"""kvdiag audit-vllm: the trigger's traffic replayed through vLLM's own block manager
(vllm/v1/core KVCacheManager + BlockPool) on CPU, with a shadow content map that checks
every slot each request reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import EXIT_FAIL, EXIT_PASS, DeviceOpt, JsonOpt, Output, handle_errors
from kvdiag.errors import KvdiagError


def _render(out: Output, run, run_dir: Path) -> None:
    from kvdiag.cli.render import compact_table

    audit = run.summary["vllm_audit"]
    ours = {}
    if run.ours is not None:
        for r in run.ours.records:
            ours.setdefault(r.round, [0, 0])
            ours[r.round][0] += r.blocks_hit
            ours[r.round][1] += r.blocks_needed
    table = compact_table(f"{audit['target']} · case {run.summary['cases'][0]} (hit rate: tokens; "
                          f"reuse: blocks; ours: {audit.get('compare', {}).get('allocator', '-')})")
    for col in ("round", "hit rate", "reuse", "ours", "foreign", "unwritten", "sessions"):
        table.add_column(col, justify="right")
    needed = {}
    for r in run.vllm.records:
        needed.setdefault(r.round, [0, 0])
        needed[r.round][0] += r.blocks_hit
        needed[r.round][1] += r.blocks_needed
    for row in audit["rounds"]:
        n = row["round"]
        mine = f"{ours[n][0] / ours[n][1]:.3f}" if n in ours and ours[n][1] else "-"
        bad = row["foreign_slots"] or row["unwritten_slots"]
        table.add_row(str(n), f"{row['vllm_hit_rate']:.3f}", f"{needed[n][0] / max(needed[n][1], 1):.3f}",
                      mine, str(row["foreign_slots"]), str(row["unwritten_slots"]),
                      ",".join(row["sessions_with_foreign_reads"]) or "-", style="red" if bad else None)
    out.out.print(table)
    out.out.print(f"vLLM prefix cache (its own PrefixCacheStats): {audit['prefix_cache_hits']} of "
                  f"{audit['prefix_cache_queries']} tokens hit ({audit['prefix_cache_hit_rate']:.3f}), "
                  f"{audit['preemptions']} preemptions, {audit['steps']} steps")
    cmp = audit.get("compare")
    if cmp:
        out.out.print(f"hit counts vs {cmp['allocator']}: {cmp['requests_differing']} of {cmp['requests']} "
                      f"requests differ (ours {cmp['blocks_hit']} blocks, vLLM {cmp['vllm_blocks_hit']})")
        for stage in cmp["explained"][1:]:
            out.out.print(f"  {stage['stage']}: {stage['requests_differing']} differ")
    n = audit["invariant_violations"]
    out.out.print(f"invariant violations: {n}")
    for line in audit["invariant_messages"][:10]:
        out.out.print(f"  {line}")
    verdict = "corruption found" if audit["corrupted"] else "no foreign slot read, invariants held"
    colour = "red" if audit["corrupted"] else "green"
    rounds = audit["corrupted_rounds"]
    where = f" in rounds {rounds}" if rounds else ""
    out.out.print(f"signature: {run.summary['signature']}")
    out.out.print(f"verdict: [bold {colour}]{verdict}[/]{where}; results in {run_dir}/")


@handle_errors
def audit_vllm(
    suite: Annotated[str, typer.Option("--suite", help="Suite YAML file, or the name of a bundled "
                                       "suite.")] = "reproduce",
    case: Annotated[str | None, typer.Option("--case", help="Case to replay (default: the suite's "
                                             "first default case).")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Replay this recorded trace (JSONL) "
                                               "instead of planning a case: no model needed.")] = None,
    write_trace: Annotated[Path | None, typer.Option("--write-trace", help="Also write the trace "
                                                     "(JSONL) to this file.")] = None,
    compare: Annotated[str, typer.Option("--compare", help="Our allocator to replay the same trace "
                                         "through, for hit counts ('none' to skip).")] = "prefix-cache",
    model: Annotated[Path | None, typer.Option("--model", help="Local HF model directory for planning "
                                               "and the reference; default: the suite's, else the "
                                               "bundled canary.")] = None,
    device: DeviceOpt = "cpu",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory (default: "
                                                 "reports/SUITE-TIME).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Audit vLLM's real allocator: replay a case's traffic (prefix lookups, allocations,
    decode appends, frees, cache_salt, preemption) through vLLM's KVCacheManager on CPU,
    without a model, and check every request's block table against a shadow content map.

    Reports foreign and unwritten slot reads per round, vLLM's reuse from its own
    prefix-cache statistics, BlockPool invariant violations, and the same trace's hit counts
    through one of our allocators. Needs vllm importable (`make vllm-env`, then
    .venv-vllm/bin/kvdiag). Exit code: 0 no corruption, 1 foreign reads or invariant
    violations, 2 bad input.
    """
    from kvdiag.report.html import write_report
    from kvdiag.runners.trace import read_trace
    from kvdiag.runners.trace import write_trace as save_trace
    from kvdiag.runners.vllm_audit import audit_trace, trace_for_case
    from kvdiag.runs import Timer, command_line, new_run_dir, now_iso, write_run
    from kvdiag.suites import load_suite

    out = Output(as_json)
    timer = Timer()
    if compare != "none":
        from reference_engine.allocators import canonical_name

        compare = canonical_name(compare)  # bad names fail here, before any work
    if trace is not None:
        if case is not None:
            raise KvdiagError("give --trace or --case, not both")
        recorded, label, seed = read_trace(trace), f"trace:{trace.name}", 0
    else:
        loaded = load_suite(suite)
        chosen = loaded.case(case) if case else (loaded.select(None) or list(loaded.cases))[0]
        out.info(f"planning {loaded.name}/{chosen.name} and running the contiguous reference ...")
        recorded = trace_for_case(loaded, chosen, model=model, device=device)
        label, seed = "canary" if model is None and loaded.model is None else str(model or loaded.model), loaded.seed
    if write_trace is not None:
        save_trace(recorded, write_trace)
        out.info(f"trace written to {write_trace}")
    run = audit_trace(recorded, compare=None if compare == "none" else compare,
                      model_label=label, seed=seed)
    summary = run.summary | {"wall_seconds": round(timer.seconds, 2), "command": command_line(),
                             "created": now_iso()}
    run_dir = new_run_dir(out_dir, recorded.config.suite)
    write_run(run_dir, run.frame, summary)
    write_report(run_dir)
    if as_json:
        out.json(summary | {"run_dir": str(run_dir)})
    else:
        _render(out, run, run_dir)
    raise typer.Exit(EXIT_FAIL if run.corrupted else EXIT_PASS)
