"""One tenant-isolation audit, start to finish (what `kvdiag isolation` does): the endpoint,
the run directory (an unwritable --out fails before any traffic), the audit itself
(kvdiag.runners.isolation), and results.parquet, summary.json and the isolation page in
the committed run directory. Library code: returns a RunResult, prints nothing."""

from __future__ import annotations

from pathlib import Path

from kvdiag.lifecycle import RunResult, no_progress
from kvdiag.runners.endpoint import Endpoint
from kvdiag.runners.isolation import IsolationPlan, run_isolation

ROW_COLUMNS = ["config", "length", "trial", "role", "ttft_s", "cached_tokens"]


def audit_isolation(base_url: str, model: str, api_key: str | None, plan: IsolationPlan, *,
                    block_size: int | None = None, out_dir: Path | None = None,
                    progress=no_progress) -> RunResult:
    """The audit of `base_url` in a finished run directory; `extra["isolation"]` holds the
    IsolationResult the terminal renderer reads. `progress`: kvdiag.lifecycle.no_progress's."""
    import pandas as pd

    from kvdiag.report.isolation import page
    from kvdiag.runs import RunDir, Timer, write_run

    timer = Timer()
    ep = Endpoint(base_url, model, api_key, timeout=120.0, retries=2)
    with RunDir.begin(out_dir, "isolation") as run:
        try:
            with progress("isolation") as update:
                result = run_isolation(ep, plan, block_size=block_size, progress=lambda done, total:
                                       update(completed=done, total=total))
        finally:
            ep.sync.close()
        summary = isolation_summary(result, base_url=base_url, model=model,
                                    wall_seconds=timer.seconds)
        frame = pd.DataFrame(result.rows, columns=ROW_COLUMNS)
        write_run(run.path, frame, summary)
        (run.path / "report.html").write_text(page(summary), encoding="utf-8")
        run_dir = run.commit()
    return RunResult("isolation", frame, summary, extra={"isolation": result}, run_dir=run_dir)


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
