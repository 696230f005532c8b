"""kvdiag isolation: the tenant-isolation audit of a live server's prefix cache
(docs/isolation.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    ApiKeyOpt,
    BaseUrlOpt,
    BlockSizeOpt,
    JsonOpt,
    OutOpt,
    Output,
    TargetModelOpt,
    handle_errors,
)


@handle_errors
def isolation(
    base_url: BaseUrlOpt = None,
    target: Annotated[str | None, typer.Option(
        "--target", show_default=False, help="Instead of --base-url: reference:ALLOCATOR (kvdiag "
        "serve, started here) or vllm-local[:FAULT] (real vLLM, started here); stopped at the "
        "end.")] = None,
    model: TargetModelOpt = None,
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
    block_size: BlockSizeOpt = None,
    adapter: Annotated[str | None, typer.Option("--adapter", help="A LoRA adapter the server serves "
                                                "under this model name: also probe a salt equal to "
                                                "it (vLLM #44701).")] = None,
    alpha: Annotated[float, typer.Option("--alpha", min=0.0, max=1.0, help="Significance of the rank "
                                         "test, per configuration over its lengths.")] = 0.01,
    min_auc: Annotated[float, typer.Option("--min-auc", min=0.5, max=1.0, help="Timing leaks only when "
                                           "max(AUC, 1 - AUC) reaches this as well.")] = 0.75,
    seed: Annotated[int | None, typer.Option("--seed", help="Replay a plan (secrets, salts, order); "
                                             "default: fresh each run.")] = None,
    sentinel: Annotated[str | None, typer.Option("--sentinel", show_default=False, help="The file a "
                                                 "sentinel inside the server writes "
                                                 "(docs/sentinel.md): any read of K/V another "
                                                 "prefix, salt or adapter wrote fails the audit, "
                                                 "even where the tenants measure no leak. On by "
                                                 "default for a --target kvdiag starts (reference, "
                                                 "vllm-local, sglang-local; beside the server's "
                                                 "log), 'off' off. For --base-url: the path or URL "
                                                 "the server's sentinel writes to.")] = None,
    api_key: ApiKeyOpt = None,
    out_dir: OutOpt = None,
    history: Annotated[Path | None, typer.Option(
        "--history", show_default=False, help="Also record the audit in this run history (SQLite), "
        "for the Prometheus export (kvdiag_isolation_*).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Audit tenant isolation of the prefix cache: a victim tenant plants secret prefixes, an
    attacker tenant probes correct vs wrong guesses (cached_tokens and time to first token),
    with no salt (exposure), per-tenant salts (judged) and one shared salt (positive control).
    A sentinel inside a server kvdiag starts checks every KV read too.
    Exit 0: isolated; 1: leaks across salts (names the prefix length, AUC, cached tokens) or
    the sentinel saw a wrong read (names the request, positions, writer); 2: cannot tell (the
    positive control did not hit, the sentinel checked nothing, endpoint down, bad input).

    Example: kvdiag isolation --base-url http://127.0.0.1:8000 --model canary --trials 8
    """
    from kvdiag.commands.isolation import audit_target
    from kvdiag.runners.live.isolation_plan import IsolationPlan, parse_lengths

    out = Output(as_json)
    plan = IsolationPlan(lengths=parse_lengths(lengths), trials=trials, warmup=warmup,
                         max_requests=max_requests, max_seconds=max_seconds, alpha=alpha,
                         min_auc=min_auc, seed=seed, adapter=adapter)
    out.finish(audit_target(base_url, target, model, api_key, plan, block_size=block_size,
                            out_dir=out_dir, history=history, sentinel=sentinel,
                            progress=out.progress, info=out.info))
