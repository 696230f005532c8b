"""kvdiag watch: a reverse proxy that checks a server's prefix cache on its own traffic
(docs/watch.md), and `kvdiag watch report`, the page of what it found."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from kvdiag.cli.common import JsonOpt, Output, handle_errors

app = typer.Typer(no_args_is_help=False, invoke_without_command=True,
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.callback()
@handle_errors
def watch(
    ctx: typer.Context,
    upstream: Annotated[str | None, typer.Option(
        "--upstream", show_default=False, help="The OpenAI-compatible server to watch (vLLM, "
        "SGLang, llama.cpp, kvdiag serve), e.g. http://127.0.0.1:8000.")] = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT the proxy listens on; "
                                        "point clients here.")] = "127.0.0.1:8100",
    file: Annotated[Path, typer.Option("--file", help="Append-only findings and windows (JSON "
                                       "lines; no prompt or answer text).")] = Path(
                                           "reports/watch/watch.jsonl"),
    sample: Annotated[float, typer.Option("--sample", help="Share of completed requests re-sent "
                                          "as a twin pair (shared replay and isolated), in [0, "
                                          "1]; 0 turns twins off.")] = 0.01,
    budget: Annotated[float, typer.Option("--budget", min=0.0, help="Twin samples per second, "
                                          "at most, whatever --sample says.")] = 1.0,
    window: Annotated[float, typer.Option("--window", min=1.0, help="Seconds per window of "
                                          "figures (rates, intervals, the file's lines).")] = 300.0,
    warmup: Annotated[float, typer.Option("--warmup", min=0.0, help="Seconds at least during "
                                          "which a hit above the bound is warm-up, not a finding "
                                          "(the upstream may hold what the proxy never saw).")] = 600.0,
    pool_tokens: Annotated[int | None, typer.Option(
        "--pool-tokens", min=0, show_default=False, help="The upstream's KV pool in tokens: "
        "warm-up also lasts until it computed this many. Default: from vLLM's /metrics, else "
        "0.")] = None,
    index_tokens: Annotated[int, typer.Option("--index-tokens", min=1, help="Prompt tokens held "
                                              "per namespace, oldest out first.")] = 2_000_000,
    isolation: Annotated[Literal["auto", "salt", "cache_prompt"], typer.Option(
        "--isolation", help="How a twin is isolated: salt (a fresh cache_salt: vLLM, kvdiag "
        "serve), cache_prompt (false: llama.cpp), or auto (cache_prompt where the upstream is "
        "llama-server, else salt).")] = "auto",
    seed: Annotated[int | None, typer.Option("--seed", show_default=False,
                                             help="Seed of the sampler.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", show_default=False, help="The served model's directory (its Hugging Face "
        "tokenizer and chat template): prompts are tokenized in the proxy, and the upstream is "
        "not asked /tokenize once per request. Counts that differ from the server's usage are "
        "left unjudged.")] = None,
) -> None:
    """Check a running server's prefix cache on its own traffic: a reverse proxy that relays
    every request unchanged and, beside the traffic, holds each reported cached-token count
    against the most that the requests it saw could explain (an over-hit is a finding), and
    re-sends a sampled share as twin pairs (shared replay against isolated) for a live
    divergence rate and SQDR. Prometheus metrics at /kvdiag/metrics; findings and windows in
    --file; `kvdiag watch report FILE` for the page. Runs until interrupted.

    Example: kvdiag watch --upstream http://127.0.0.1:8000 --listen 0.0.0.0:8100
    """
    if ctx.invoked_subcommand is not None:
        return
    from kvdiag.errors import KvdiagError
    from kvdiag.watch.run import WatchSettings, claim_port, serve

    if upstream is None:
        raise KvdiagError("--upstream URL is required (the server to watch); see kvdiag watch --help")
    settings = WatchSettings.parse(upstream, listen, file=str(file), sample=sample, budget=budget,
                                   window=window, warmup=warmup, pool_tokens=pool_tokens,
                                   index_tokens=index_tokens, isolation=isolation, seed=seed,
                                   tokenizer=str(tokenizer) if tokenizer else None)
    if tokenizer is not None:
        from kvdiag.watch.tokens import check_tokenizer

        check_tokenizer(tokenizer)
    sock = claim_port(settings.host, settings.port)
    try:
        serve(settings, sock, say=Output().info)
    finally:
        sock.close()


@app.command("report")
@handle_errors
def report(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="A kvdiag watch --file.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", show_default=False,
                                             help="The HTML page. Default: FILE with .html.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """A watch file's verdict and page: every window's figures, each namespace's, every
    finding. Exit 0: requests judged, nothing found; 1: findings; 2: nothing judged.

    Example: kvdiag watch report reports/watch/watch.jsonl -o watch.html
    """
    from kvdiag.errors import KvdiagError
    from kvdiag.watch.log import read_watch
    from kvdiag.watch.page import judge_file, render

    if not path.is_file():
        raise KvdiagError(f"{path}: no such watch file")
    watch = read_watch(path)
    judged = judge_file(watch)
    target = out or path.with_suffix(".html")
    target.write_text(render(watch))
    Output(as_json).show({"verdict": judged.verdict.value, "reason": judged.reason,
                          "page": str(target), "findings": len(watch.findings),
                          "windows": len(watch.windows)},
                         f"{judged.verdict.value.upper()} {judged.reason}", f"page: {target}")
    raise typer.Exit(judged.verdict.exit_code)
