"""kvdiag isolation: the tenant-isolation audit of a live server's prefix cache
(docs/isolation.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import EXIT_ERROR, JsonOpt, Output, handle_errors


@handle_errors
def isolation(
    base_url: Annotated[str, typer.Option("--base-url", help="The server, e.g. http://127.0.0.1:8000 "
                                          "(with or without /v1). Only this endpoint gets traffic.")],
    model: Annotated[str, typer.Option("--model", help="Model name as the server serves it.")],
    lengths: Annotated[str, typer.Option("--lengths", help="Secret prefix lengths in tokens, comma-"
                                         "separated, or auto: 1, 4, 16 and 128 blocks (within "
                                         "max_model_len).")] = "auto",
    trials: Annotated[int, typer.Option("--trials", help="Correct and wrong guesses per prefix "
                                        "length and configuration.")] = 8,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Unmeasured rounds per length first.")] = 2,
    max_requests: Annotated[int, typer.Option("--max-requests", min=1, help="Refuse a plan that needs "
                                              "more requests than this.")] = 2000,
    max_seconds: Annotated[float, typer.Option("--max-seconds", min=1.0, help="Stop measuring after "
                                               "this long (the verdict is then inconclusive unless "
                                               "a leak was already found).")] = 900.0,
    block_size: Annotated[int | None, typer.Option("--block-size", min=1, help="The server's block "
                                                   "size when /metrics has no vllm:cache_config_info "
                                                   "(default 16).")] = None,
    adapter: Annotated[str | None, typer.Option("--adapter", help="A LoRA adapter the server serves "
                                                "under this model name: also probe a salt equal to "
                                                "it (vLLM #44701).")] = None,
    alpha: Annotated[float, typer.Option("--alpha", min=0.0, max=1.0, help="Significance of the rank "
                                         "test, per configuration over its lengths.")] = 0.01,
    min_auc: Annotated[float, typer.Option("--min-auc", min=0.5, max=1.0, help="Timing leaks only when "
                                           "max(AUC, 1 - AUC) reaches this as well.")] = 0.75,
    seed: Annotated[int | None, typer.Option("--seed", help="Replay a plan (secrets, salts, order); "
                                             "default: fresh each run.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory (default: "
                                                 "reports/isolation-TIME).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Audit tenant isolation of the prefix cache: a victim tenant plants secret prefixes, an
    attacker tenant probes correct vs wrong guesses (cached_tokens and time to first token),
    with no salt (exposure), per-tenant salts (judged) and one shared salt (positive control).
    Exit 0: isolated; 1: leaks across salts (names the prefix length, AUC, cached tokens);
    2: cannot tell (the positive control did not hit, endpoint down, bad input).

    Example: kvdiag isolation --base-url http://127.0.0.1:8000 --model canary --trials 8
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvdiag.report.isolation import page
    from kvdiag.runners.endpoint import Endpoint
    from kvdiag.runners.isolation import IsolationPlan, parse_lengths, run_isolation
    from kvdiag.runs import RunDir, Timer

    out = Output(as_json)
    timer = Timer()
    plan = IsolationPlan(lengths=parse_lengths(lengths), trials=trials, warmup=warmup,
                         max_requests=max_requests, max_seconds=max_seconds, alpha=alpha,
                         min_auc=min_auc, seed=seed, adapter=adapter)
    ep = Endpoint(base_url, model, api_key, timeout=120.0, retries=2)
    with RunDir.begin(out_dir, "isolation") as run:  # an unwritable --out fails before any traffic
        try:
            with Progress(TextColumn("isolation"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=out.err, transient=True, disable=as_json) as bar:
                task = bar.add_task("isolation", total=None)
                result = run_isolation(ep, plan, block_size=block_size, progress=lambda done, total:
                                       bar.update(task, completed=done, total=total))
        finally:
            ep.sync.close()
        summary = isolation_summary(result, base_url=base_url, model=model, wall_seconds=timer.seconds)
        write_isolation_run(run.path, result, summary)
        (run.path / "report.html").write_text(page(summary), encoding="utf-8")
        run_dir = run.commit()
    if as_json:
        out.json(summary | {"run_dir": str(run_dir)})
    else:
        _print(out, result, run_dir)
    raise typer.Exit(result.exit_code if result.exit_code in (0, 1) else EXIT_ERROR)


def isolation_summary(result, *, base_url: str, model: str, wall_seconds: float) -> dict:
    """summary.json for an isolation run: the shared fields (signature, suite, verdict, rounds,
    wall_seconds) plus `reason`, `leaks` and the `isolation` block the renderer reads."""
    from kvdiag.runs import command_line, now_iso, signature

    sig = signature(engine="endpoint", allocators=["isolation"], block_size=result.server["block_size"],
                    model=model, suite="isolation", seed=result.plan["seed"])
    exposure = [c for c in result.cells if c["config"] == "no-salt"]
    return {
        "signature": sig, "suite": "isolation", "verdict": result.verdict, "reason": result.reason,
        "target": base_url, "model": model, "created": now_iso(), "command": command_line(),
        "rounds": [], "sqdr": {}, "brai": {}, "wall_seconds": wall_seconds, "requests": result.requests,
        "leaks": result.leaks,
        "isolation": {"server": result.server, "plan": result.plan, "cells": result.cells,
                      "exposure_leaks": any(c["leaks"] for c in exposure)},
    }


def write_isolation_run(run_dir: Path, result, summary: dict) -> None:
    """results.parquet (one row per request) and summary.json, as every run directory has."""
    import pandas as pd

    from kvdiag.runs import write_run

    write_run(run_dir, pd.DataFrame(result.rows, columns=["config", "length", "trial", "role",
                                                          "ttft_s", "cached_tokens"]), summary)


def _print(out: Output, result, run_dir: Path) -> None:
    from rich.table import Table

    table = Table(title="the attacker's correct (ok) vs wrong (bad) guesses", title_justify="left")
    for col in ("config", "tokens", "cached ok/bad", "TTFT ok/bad ms", "AUC", "p", "told apart"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for c in sorted(result.cells, key=lambda c: (c["config"], c["length"])):
        told = {(True, True): "both", (True, False): "content", (False, True): "timing"}.get(
            (c["content_leak"], c["timing_leak"]), "no")
        table.add_row(c["config"], str(c["length"]), f"{c['cached_correct_mean']:.0f} / {c['cached_wrong_mean']:.0f}",
                      f"{c['ttft_correct_median_s'] * 1e3:.0f} / {c['ttft_wrong_median_s'] * 1e3:.0f}",
                      f"{c['auc']:.2f}", f"{c['p_value']:.2g}", told)
    out.out.print(table)
    exposed = [c for c in result.cells if c["config"] == "no-salt" and c["leaks"]]
    if exposed:
        worst = max(exposed, key=lambda c: c["length"])
        out.out.print(f"exposure without salts (not judged): prefixes told apart at "
                      f"{', '.join(str(c['length']) for c in sorted(exposed, key=lambda c: c['length']))} "
                      f"tokens; at {worst['length']}: AUC {worst['auc']:.2f}, cached "
                      f"{worst['cached_correct_mean']:.0f} vs {worst['cached_wrong_mean']:.0f}")
    colour = {"pass": "green", "fail": "red"}.get(result.verdict, "yellow")
    out.out.print(f"[bold {colour}]{result.verdict.upper()}[/]: {result.reason}")
    out.out.print(f"{result.requests} requests, {result.wall_seconds:.1f} s; run directory {run_dir}")
