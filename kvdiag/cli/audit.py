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
    check_allocators,
    handle_errors,
    load_cases,
)
from kvdiag.errors import KvdiagError


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
    .venv-vllm/bin/kvdiag). Exit code: 0 no corruption, 1 foreign reads or invariant
    violations, 2 bad input.

    Example: .venv-vllm/bin/kvdiag audit-vllm --case trigger
    """
    from kvdiag.lifecycle import finish_run
    from kvdiag.runners.trace import read_trace
    from kvdiag.runners.trace import write_trace as save_trace
    from kvdiag.runners.vllm_audit import audit_trace, trace_for_case
    from kvdiag.runs import RunDir, Timer

    out = Output(as_json)
    timer = Timer()
    if compare != "none":
        from reference_engine.allocators import canonical_name

        check_allocators([compare])  # bad names fail here, before any work
        compare = canonical_name(compare)
    if trace is not None:
        if case is not None:
            raise KvdiagError("give --trace or --case, not both")
        recorded, label, seed = read_trace(trace), f"trace:{trace.name}", 0
    else:
        loaded, (chosen,) = load_cases(suite, case, one=True)
        out.info(f"planning {loaded.name}/{chosen.name} and running the contiguous reference ...")
        recorded = trace_for_case(loaded, chosen, model=model, device=device)
        label, seed = "canary" if model is None and loaded.model is None else str(model or loaded.model), loaded.seed
    if write_trace is not None:
        save_trace(recorded, write_trace)
        out.info(f"trace written to {write_trace}")
    run = RunDir.begin(out_dir, recorded.config.suite)
    with run:
        result = audit_trace(recorded, compare=None if compare == "none" else compare,
                             model_label=label, seed=seed)
    out.finish(finish_run(result, run, timer))
