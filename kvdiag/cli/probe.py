"""kvdiag probe: test a live OpenAI-compatible server (vLLM, SGLang, kvdiag serve) for KV
cache corruption from outside, against cache-isolated runs of the same requests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import EXIT_FAIL, EXIT_PASS, JsonOpt, Output, handle_errors
from kvdiag.errors import KvdiagError


@handle_errors
def probe(
    base_url: Annotated[str, typer.Option("--base-url", help="The server, e.g. http://127.0.0.1:8000 "
                                          "(with or without /v1).")],
    model: Annotated[str, typer.Option("--model", help="Model name as the server serves it.")],
    suite: Annotated[str, typer.Option("--suite", help="Suite YAML or bundled name.")] = "reproduce",
    case: Annotated[str | None, typer.Option("--case", help="Case (default: the suite's first default).")] = None,
    style: Annotated[str | None, typer.Option("--style", help="canary (for the canary model) or natural "
                                              "(English, for real chat models); default: the suite's.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token.")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Requests in flight at once.")] = 16,
    think_scale: Annotated[float, typer.Option("--think-scale", min=0.0, help="Seconds per think step "
                                               "between a session's turns.")] = 0.02,
    numerics_margin: Annotated[float, typer.Option("--numerics-margin", min=0.0, help="Nats: a divergence "
                                                   "at a smaller margin (or within the noise floor) counts "
                                                   "as numerics, not corruption.")] = 1.0,
    floor_sessions: Annotated[int, typer.Option("--floor-sessions", min=1, help="Sessions whose isolated "
                                                "rounds are repeated to measure the noise floor.")] = 4,
    count_with: Annotated[str, typer.Option("--count-with", help="How to count prompt tokens while "
                                            "planning: tokenize (vLLM's /tokenize; falls back to usage "
                                            "on 404) or usage (usage.prompt_tokens of 1-token requests).")] = "tokenize",
    resume: Annotated[Path | None, typer.Option("--resume", help="Finish an interrupted probe in this "
                                                "run directory.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory (default: reports/probe-SUITE-TIME).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe a live server: every round twice, sharing the cache and isolated with a fresh
    cache_salt; classify each divergence as numerics or corruption against a measured noise
    floor. Exit 0: no corruption; 1: corruption found (the rounds are named); 2: the run could
    not be made (server down, bad suite).
    """
    import dataclasses

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvdiag.report.html import write_report
    from kvdiag.runners.probe import ProbeSettings
    from kvdiag.runners.probe_run import run_probe
    from kvdiag.runs import Timer, command_line, new_run_dir, now_iso, write_run
    from kvdiag.suites import load_suite

    out = Output(as_json)
    timer = Timer()
    loaded = load_suite(suite)
    if style:
        loaded = dataclasses.replace(loaded, style=style)
    chosen = loaded.case(case) if case else (loaded.select(None) or list(loaded.cases))[0]
    if resume is not None and not (resume / "probe.json").is_file():
        raise KvdiagError(f"{resume}: not a probe run directory (no probe.json)")
    run_dir = resume if resume is not None else new_run_dir(out_dir, f"probe-{loaded.name}")
    settings = ProbeSettings(concurrency=concurrency, think_scale=think_scale,
                             floor_sessions=floor_sessions, numerics_margin=numerics_margin)
    from kvdiag.runners.endpoint import Endpoint

    Endpoint(base_url, model, api_key).check()  # a dead server: one line, exit 2, before anything
    out.info(f"planning {chosen.sessions} sessions x {chosen.rounds} rounds with {base_url}'s tokenizer")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out.err, transient=True, disable=as_json) as bar:
        task = bar.add_task("probe", total=None)

        def progress(phase: str, done: int, total: int) -> None:
            bar.update(task, description=phase, completed=done, total=total)

        frame, summary = run_probe(base_url, model, loaded, chosen, run_dir, api_key=api_key,
                                   settings=settings, resume=resume is not None, warn=out.warn,
                                   count_with=count_with,
                                   progress=progress)
    summary |= {"wall_seconds": round(timer.seconds, 2), "command": command_line(), "created": now_iso()}
    shared_rows = frame[frame["allocator"] == "shared"]
    write_run(run_dir, frame, summary)
    write_report(run_dir)
    if as_json:
        out.json(summary)
    else:
        _render(out, summary, shared_rows, run_dir)
    raise typer.Exit(EXIT_FAIL if summary["verdict"] == "fail" else EXIT_PASS)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _render(out: Output, summary: dict, shared, run_dir: Path) -> None:
    from kvdiag.cli.render import compact_table

    table = compact_table(f"probe {summary['targets'][0]} ({summary['isolation']} isolation)")
    for col in ("round", "BLEU-4", "fact-check", "ref fact", "diverged", "numerics", "corruption", "cached"):
        table.add_column(col, justify="right")
    rows = {r["round"]: r for r in summary["rounds"] if r["allocator"] == "shared"}
    ref = {r["round"]: r for r in summary["rounds"] if r["allocator"] == "isolated"}
    for n in sorted(rows):
        part = shared[shared["round"] == n]
        r = rows[n]
        table.add_row(str(n), _fmt(r["bleu4"], ".1f"), _fmt(r["fact_check_pass_rate"], ".2f"),
                      _fmt(ref.get(n, {}).get("fact_check_pass_rate"), ".2f"),
                      str(int((part["classification"] != "match").sum())),
                      str(int((part["classification"] == "numerics").sum())),
                      str(int((part["classification"] == "corruption").sum())),
                      _fmt(r["block_reuse_rate"], ".2f"), style="red" if (part["classification"] == "corruption").any() else None)
    out.out.print(table)
    nf = summary["noise_floor"]
    out.out.print(f"noise floor: {nf['diverged_pairs']}/{nf['pairs']} repeated isolated requests diverged, "
                  f"largest margin {nf['margin']:.3f} nats; corruption threshold {nf['threshold']:.3f} nats")
    pc = summary["server_prefix_cache"]
    if pc["hit_rate"] is not None:
        out.out.print(f"server prefix cache (shared phase): {pc['hits']:.0f}/{pc['queries']:.0f} tokens hit "
                      f"({pc['hit_rate']:.1%})")
    if summary["verdict"] == "fail":
        out.out.print(f"[bold red]FAIL[/] corruption in rounds {summary['corruption_rounds']} "
                      f"({summary['corrupted_requests']} requests; {summary['numerics_requests']} numerics)")
    else:
        out.out.print(f"[bold green]PASS[/] no divergence beyond the noise floor "
                      f"({summary['numerics_requests']} numerics)")
    out.out.print(f"run directory: {run_dir}")
