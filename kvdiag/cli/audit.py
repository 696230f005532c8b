"""kvdiag audit-vllm: the trigger's traffic replayed through vLLM's own block manager
(vllm/v1/core KVCacheManager + BlockPool) on CPU, with a shadow content map that checks
every slot each request reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    DeviceOpt,
    JsonOpt,
    ModelOpt,
    OneCaseOpt,
    OutOpt,
    Output,
    SuiteOpt,
    handle_errors,
)


@handle_errors
def audit_vllm(
    suite: SuiteOpt = "reproduce",
    case: OneCaseOpt = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Replay this recorded trace (JSONL) "
                                               "instead of planning a case: no model needed.")] = None,
    write_trace: Annotated[Path | None, typer.Option("--write-trace", help="Also write the trace "
                                                     "(JSONL) to this file.")] = None,
    compare: Annotated[str, typer.Option("--compare", help="Our allocator to replay the same trace "
                                         "through, for hit counts ('none' to skip).")] = "prefix-cache",
    fault: Annotated[str | None, typer.Option("--fault", show_default=False, help="Plant this fault "
                                              "into vLLM in this process for the replay (the model-"
                                              "free positive control; `kvdiag detect --list` names "
                                              "them).")] = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Audit vLLM's real allocator: replay a case's traffic (prefix lookups, allocations,
    decode appends, frees, cache_salt, preemption) through vLLM's KVCacheManager on CPU,
    without a model, and check every request's block table against a shadow content map.

    Reports foreign and unwritten slot reads per round, vLLM's reuse from its own
    prefix-cache statistics, BlockPool invariant violations, and the same trace's hit counts
    through one of our allocators. Needs vllm importable (`make vllm-env`, then
    .venv-vllm/bin/kvdiag). Exit code: 0 no corruption, with cached blocks recycled; 1 foreign
    reads, invariant violations or hits across tenants; 2 bad input, or the replay recycled
    no cached block (inconclusive: the trigger was not reached).

    Example: .venv-vllm/bin/kvdiag audit-vllm --case trigger
    """
    from kvdiag.commands.audit import audit_run

    out = Output(as_json)
    out.finish(audit_run(suite, case, trace=trace, write_trace=write_trace, compare=compare,
                         model=model, device=device, out_dir=out_dir, fault=fault, info=out.info))
