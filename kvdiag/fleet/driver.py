"""The fleet's Ray driver. Each cell is one Ray task (kvdiag.fleet.cell.measure_cell) with
its declared CPUs, a time limit and `max_retries`, so a cell whose worker process dies is
run again by Ray. Results stream back as they finish; only this process writes: each cell's
run directory (kvdiag.commands.regress.record: atomic `.partial` -> committed), the SQLite
history (one row per finished cell) and FLEET_RUN/cells.jsonl (one line per outcome).

    FLEET_RUN/fleet.json      the plan (kvdiag.fleet.plan.FleetPlan): fleet file, history,
                              baseline, targets, cells
    FLEET_RUN/cells.jsonl     one outcome per line, the last line of a cell wins
    FLEET_RUN/<cell id>/      that cell's regress run directory (report.html, summary.json)

A prepare() that fails (dead endpoint, key mismatch, a target regress cannot run) or a task
that raises or times out is an ERROR cell; every other cell reads its regress run's verdict
(PASS, FAIL, INCONCLUSIVE or ERROR), and the fleet's is the worst of them
(kvdiag.verdicts.judge_fleet). Resume skips a cell
whose run directory is committed and whose history row exists; anything else of it is
removed and the cell runs again, so the history never holds a cell twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.fleet.cell import PID_DIR_ENV, CellResult, measure_cell
from kvdiag.fleet.outcome import CELLS_FILE, Outcome, read_outcomes
from kvdiag.fleet.plan import PLAN_FILE, FleetPlan
from kvdiag.fleet.spec import Cell, Fleet
from kvdiag.record.summary import RegressProbeSummary, RegressRun
from kvdiag.verdicts import Verdict, judge_unmeasured

START_ATTEMPTS = 3  # a local Ray that misses its start-up deadline is started again
BACKSTOP = 3.0  # a cell still unanswered this many time limits after submission is cancelled


def run_fleet(fleet: Fleet, run_dir: Path, *, resume: bool = False, ray_address: str | None = None,
              num_cpus: int | None = None, on_cell: Callable[[Outcome], None] = lambda o: None
              ) -> list[Outcome]:
    """Run every cell not finished yet; return every cell's outcome, in the fleet's order."""
    run_dir = Path(run_dir).resolve()
    if resume and not (run_dir / PLAN_FILE).is_file():
        raise KvdiagError(f"--resume {run_dir}: not a fleet run (no {PLAN_FILE})")
    run_dir.mkdir(parents=True, exist_ok=True)
    FleetPlan.of(fleet).save(run_dir)
    from kvdiag.regress import history as H

    H.connect(fleet.history).close()  # created (or checked) before any cell runs
    done = _finished(fleet, run_dir)
    outcomes = {cid: o for cid, o in done.items()}
    for o in done.values():
        on_cell(o)
    todo = [c for c in fleet.cells if c.id not in done]
    if todo:
        _start_ray(ray_address, num_cpus)
        try:
            for o in _drive(fleet, run_dir, todo):
                outcomes[o.cell] = _append(run_dir, o)
                on_cell(o)
        finally:
            import ray

            ray.shutdown()
    return [outcomes[c.id] for c in fleet.cells if c.id in outcomes]


def _append(run_dir: Path, o: Outcome) -> Outcome:
    with open(run_dir / CELLS_FILE, "a") as f:
        f.write(json.dumps(o.record()) + "\n")
    return o


def _start_ray(address: str | None, num_cpus: int | None) -> None:
    try:
        import ray
    except ImportError:
        raise KvdiagError("kvdiag fleet needs Ray: pip install 'kvdiag[fleet]'") from None
    import tenacity

    def give_up(state: tenacity.RetryCallState) -> None:
        ray.shutdown()
        first = str(state.outcome.exception()).splitlines()[0]
        raise KvdiagError(f"Ray could not start {address or 'locally'}: {first}") from None

    # join an existing cluster (ray up, KubeRay: its workers must have kvdiag), tried once; or
    # the embedded default, a local Ray on this machine stopped at the end, started again at
    # once after a failure (Ray gives its raylet 30 s to register: a loaded machine misses it)
    where = {"address": address} if address else {"num_cpus": num_cpus or os.cpu_count(),
                                                  "include_dashboard": False}
    tenacity.Retrying(stop=tenacity.stop_after_attempt(1 if address else START_ATTEMPTS),
                      retry=tenacity.retry_if_exception_type(Exception),
                      before_sleep=lambda _: ray.shutdown(), retry_error_callback=give_up)(
        ray.init, log_to_driver=False, **where)


def _finished(fleet: Fleet, run_dir: Path) -> dict[str, Outcome]:
    """The cells an earlier driver finished (committed and in the history), with their last
    recorded outcome; the leftovers of every other cell are removed."""
    recorded = set()
    if fleet.history.is_file():
        from kvdiag.regress import history as H

        recorded = set(H.runs(fleet.history)["run_dir"].dropna())
    last = read_outcomes(run_dir)
    done = {}
    for cell in fleet.cells:
        final, partial = run_dir / cell.id, run_dir / (cell.id + ".partial")
        if final.is_dir() and str(final) in recorded:
            # killed between the history row and cells.jsonl: the outcome is in summary.json
            o = last.get(cell.id) or _append(run_dir, _from_summary(fleet, cell, final))
            done[cell.id] = dataclasses.replace(o, resumed=True)
            continue
        shutil.rmtree(partial, ignore_errors=True)  # killed mid-record: never a verdict
        if final.is_dir():  # committed but never recorded (killed before the history row)
            final.rename(_free(run_dir / (cell.id + ".unrecorded")))
    return done


def _from_summary(fleet: Fleet, cell: Cell, run_dir: Path) -> Outcome:
    from kvdiag.record.rundir import load_summary

    summary = load_summary(run_dir)
    if not isinstance(summary, RegressRun):
        raise KvdiagError(f"{run_dir}: a {summary.kind} run where the fleet wrote a regress run")
    t, reg = fleet.by_name[cell.target], summary.regress
    return Outcome(cell.id, t.name, t.spec, cell.suite_name, cell.case,
                   reg.verdict, worst_metric(summary),
                   str(run_dir), reg.run_id, summary.wall_seconds, events=coverage_of(summary))


def _free(path: Path) -> Path:
    n, out = 1, path
    while out.exists():
        n += 1
        out = path.with_name(f"{path.name}-{n}")
    return out


def _prepare(fleet: Fleet, run_dir: Path, cell: Cell, stack: ExitStack):
    """The cell's prepared run and options. A local engine's server is started here, on this
    machine, for this cell's suite and case (its pool sized from them), and stays up until
    `stack` closes: once its outcome is recorded."""
    from kvdiag.commands import regress as job

    t = fleet.by_name[cell.target]
    opts = job.Options(suite=cell.suite, target=t.spec, model=t.model, cases=cell.case,
                       baseline=fleet.baseline.resolve(), history=fleet.history.resolve(),
                       out=run_dir / cell.id, flags=dict(t.flags), concurrency=t.requests,
                       api_key=os.environ.get(t.api_key_env) if t.api_key_env else None)
    if t.is_local:
        opts = stack.enter_context(job.serving(opts))
    return job.prepare(opts), opts


def _placement(local: bool) -> dict:
    """Ray task options for a target's cells: a local engine's server listens on the driver's
    machine (loopback), so its cells run there."""
    if not local:
        return {}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}


def _drive(fleet: Fleet, run_dir: Path, todo: list[Cell]):
    """Submit cells as their target's concurrency allows; yield each outcome as it lands."""
    import ray

    task = ray.remote(measure_cell)
    pid_dir = os.environ.get(PID_DIR_ENV)
    pending, inflight, busy = list(todo), {}, {t.name: 0 for t in fleet.targets}
    while pending or inflight:
        for cell in list(pending):
            t = fleet.by_name[cell.target]
            if busy[t.name] >= t.concurrency:
                continue
            pending.remove(cell)
            stack = ExitStack()  # what the cell holds until it is recorded (a vLLM server)
            try:
                p, opts = _prepare(fleet, run_dir, cell, stack)
            except (KvdiagError, FileNotFoundError, ValueError, OSError) as e:
                stack.close()
                yield _error(fleet, cell, e)
                continue
            ref = task.options(num_cpus=t.num_cpus, max_retries=fleet.max_retries,
                               retry_exceptions=False, name=cell.id, **_placement(t.is_local)).remote(
                p, opts, cell.id, fleet.time_limit, t.num_cpus, pid_dir)
            inflight[ref] = (cell, p, opts, time.monotonic(), stack)
            busy[t.name] += 1
        if not inflight:
            continue
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=2.0)
        for ref, (cell, p, opts, since, stack) in list(inflight.items()):
            late = time.monotonic() - since > BACKSTOP * fleet.time_limit
            if ref not in ready and not late:
                continue
            del inflight[ref]
            busy[cell.target] -= 1
            with stack:  # a local engine's cell: its server stops once its outcome is known
                if late and ref not in ready:
                    ray.cancel(ref, force=True)
                    shutil.rmtree(p.run.path, ignore_errors=True)
                    outcome = _error(fleet, cell, KvdiagError(f"no answer within {BACKSTOP:g} x its time limit"))
                else:
                    outcome = _record(fleet, cell, p, opts, ref)
            yield outcome


def _record(fleet: Fleet, cell: Cell, p, opts, ref) -> Outcome:
    import ray

    from kvdiag.commands.regress_record import record
    from kvdiag.record.rundir import Timer

    try:
        got: CellResult = ray.get(ref)
    except Exception as e:  # the task raised, timed out, or its worker died past its retries
        shutil.rmtree(p.run.path, ignore_errors=True)
        return _error(fleet, cell, getattr(e, "cause", None) or e)
    for name, data in got.files.items():  # the probe's working files, for the record
        (p.run.path / name).write_bytes(data)
    timer = Timer()
    timer.start -= got.seconds
    try:
        res = record(p, opts, got.result, got.cold, timer)
    except Exception as e:  # a bug while recording one cell must not lose the others
        return _error(fleet, cell, e)
    t = fleet.by_name[cell.target]
    return Outcome(cell.id, t.name, t.spec, cell.suite_name, cell.case,
                   res.verdict, worst_metric(res.summary),
                   str(res.run_dir), res.extra.run_id, round(got.seconds, 2),
                   events=coverage_of(res.summary))


def coverage_of(summary: RegressRun) -> str | None:
    """A live cell's lifecycle coverage in a few words; None for an in-process cell."""
    rows = summary.events if isinstance(summary, RegressProbeSummary) else []
    if not rows:
        return None
    missed = [r.event for r in rows if not r.reached]
    return f"{len(rows) - len(missed)}/{len(rows)} events" + (f" (not: {', '.join(missed)})" if missed else "")


def worst_metric(summary: RegressRun) -> str:
    """FAIL: the first regressed metric and its rounds (or the ground-truth finding);
    INCONCLUSIVE or ERROR: why; PASS: the main case's SQDR and BRAI."""
    reg = summary.regress
    if reg.verdict in (Verdict.INCONCLUSIVE, Verdict.ERROR):
        return reg.reason or summary.reason
    for metric, rounds in reg.regressed.items():
        if rounds:
            return f"{metric}: rounds {', '.join(map(str, rounds))}"
    if reg.ground_truth_failures:
        return reg.ground_truth_failures[0]
    if reg.failed_checks:
        return reg.failed_checks[0].message
    m = next(iter(reg.measurement.values()), None)
    brai = next(iter(reg.brai.values()), None)
    return f"sqdr {m.sqdr if m else None}, brai {brai}"


def _error(fleet: Fleet, cell: Cell, e: BaseException) -> Outcome:
    t = fleet.by_name[cell.target]
    text = (str(e).strip().splitlines() or [type(e).__name__])[-1] if not isinstance(e, KvdiagError) \
        else str(e).splitlines()[0]
    judged = judge_unmeasured(f"{type(e).__name__}: {text}"[:300])
    return Outcome(cell.id, t.name, t.spec, cell.suite_name, cell.case,
                   judged.verdict, judged.reason)
