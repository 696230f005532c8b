"""Prometheus metrics from the run history: the latest run of each (suite, target, model),
as a node_exporter textfile (written atomically) or from an HTTP exporter that rereads the
history on every scrape.

Labels follow vLLM's (`model_name`), plus `engine`, `suite` and `target` (one exporter
serves a whole fleet, so the target tells two endpoints of the same model apart):

    kvdiag_sqdr                          (pass rate@1 - pass rate@n) / n, main case
    kvdiag_brai                          |block reuse rate - the guarded baseline's|
    kvdiag_fact_check_pass_ratio{round}  per round
    kvdiag_bleu4{round}                  per round, 0..100 as sacrebleu prints it
    kvdiag_attention_leakage             mean attention mass on foreign slots (reference engine)
    kvdiag_cache_divergence_ratio        requests whose output the cache changed / requests
    kvdiag_block_reuse_ratio             blocks served from the prefix cache / blocks needed
    kvdiag_run_verdict{verdict}          the last run's verdict as a state set: 1 for its
                                         verdict (pass, fail, inconclusive, error), 0 for
                                         the others
    kvdiag_regress_passed                1 pass, 0 anything else (kept for older dashboards)
    kvdiag_last_run_timestamp_seconds    when the run was made
    kvdiag_run_info                      1, with engine_version, run_id, signature

and from the newest tenant-isolation audit of each (target, model) (`kvdiag isolation
--history`), labelled model_name and target:

    kvdiag_isolation_passed              1 isolated, 0 leaks or cannot tell
    kvdiag_isolation_auc{config,length}  ROC AUC of TTFT, correct vs wrong guesses
    kvdiag_isolation_cached_tokens{config,length,guess}  mean cached tokens per guess

The history's rows are read typed (kvdiag.export.rows: RunRow with its rounds, IsolationRow).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.export.rows import IsolationRow, RoundRow, RunRow, latest_isolation, latest_runs
from kvdiag.verdicts import Verdict

LABELS = ("model_name", "engine", "suite", "target")
TEXTFILE_NAME = "kvdiag.prom"
RUN_GAUGES = {  # metric -> (history column: a RunRow field, help)
    "kvdiag_sqdr": ("sqdr", "Session quality decay rate: (fact-check pass rate at round 1 - at round n) / n."),
    "kvdiag_brai": ("brai", "Block reuse anomaly index: |block reuse rate - the guarded baseline's|."),
    "kvdiag_attention_leakage": ("attention_leakage", "Mean attention mass on foreign or unwritten KV slots per generated token."),
    "kvdiag_cache_divergence_ratio": ("divergence_ratio", "Requests whose output the cache changed / requests."),
    "kvdiag_block_reuse_ratio": ("block_reuse_rate", "Blocks served from the prefix cache / blocks the prompts need."),
}
ROUND_GAUGES = {  # metric -> (history column: a RoundRow field, help)
    "kvdiag_fact_check_pass_ratio": ("fact_check_pass_rate", "Answers whose fact triple matches the knowledge base / answers checked, per round."),
    "kvdiag_bleu4": ("bleu4", "BLEU-4 of the outputs against the ground truth's, per round (0-100)."),
}


class HistoryCollector:
    """A prometheus_client collector over the history file (read on every collect)."""

    def __init__(self, history: Path, suite: str | None = None) -> None:
        self.history, self.suite = Path(history), suite

    def describe(self):
        return []  # no fixed description: the families depend on the history

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        present = self.history.is_file()
        runs = latest_runs(self.history, self.suite) if present else []
        audits = latest_isolation(self.history) if present and self.suite is None else []
        history = GaugeMetricFamily("kvdiag_history_present", "1 when the run history file "
                                    "exists and holds a run, 0 otherwise (KvdiagHistoryMissing "
                                    "fires on 0).", labels=("history",))
        history.add_metric([str(self.history)], 1.0 if runs or audits else 0.0)
        yield history
        yield from _isolation_families(audits)
        run_families = {name: GaugeMetricFamily(name, doc, labels=LABELS)
                        for name, (_, doc) in RUN_GAUGES.items()}
        round_families = {name: GaugeMetricFamily(name, doc, labels=(*LABELS, "round"))
                          for name, (_, doc) in ROUND_GAUGES.items()}
        passed = GaugeMetricFamily("kvdiag_regress_passed", "1 when the last regression run passed, "
                                   "0 otherwise (failed, inconclusive or error: see kvdiag_run_verdict).",
                                   labels=LABELS)
        state = GaugeMetricFamily("kvdiag_run_verdict", "The last regression run's verdict: 1 for "
                                  "the label value it had (pass, fail, inconclusive, error), 0 for "
                                  "the others.", labels=(*LABELS, "verdict"))
        stamp = GaugeMetricFamily("kvdiag_last_run_timestamp_seconds", "When the last regression run was made (Unix time).", labels=LABELS)
        info = GaugeMetricFamily("kvdiag_run_info", "The last regression run: engine version, run id and signature.",
                                 labels=(*LABELS, "engine_version", "run_id", "signature"))
        for run in runs:
            labels = [run.model_name, str(run.engine), str(run.suite), str(run.target)]
            for name, (column, _) in RUN_GAUGES.items():
                if (v := _gauge(run, column)) is not None:
                    run_families[name].add_metric(labels, v)
            for r in run.rounds:
                for name, (column, _) in ROUND_GAUGES.items():
                    if (v := _gauge(r, column)) is not None:
                        round_families[name].add_metric([*labels, str(r.round)], v)
            passed.add_metric(labels, 1.0 if run.verdict.passed else 0.0)
            for v in Verdict:
                state.add_metric([*labels, v.value], 1.0 if v is run.verdict else 0.0)
            stamp.add_metric(labels, run.timestamp)
            info.add_metric([*labels, str(run.engine_version), str(run.run_id),
                             str(run.signature)], 1.0)
        yield from run_families.values()
        yield from round_families.values()
        yield from (passed, state, stamp, info)


def _gauge(row: RunRow | RoundRow, column: str) -> float | None:
    """A gauge's value from its typed row (None: no sample); `column` names one of its fields."""
    return getattr(row, column)


def _isolation_families(rows: list[IsolationRow]):
    from prometheus_client.core import GaugeMetricFamily

    labels = ("model_name", "target")
    passed = GaugeMetricFamily("kvdiag_isolation_passed", "1 when the last tenant-isolation audit "
                               "found the per-tenant salts isolated, 0 when it found a leak or "
                               "could not tell.", labels=labels)
    auc = GaugeMetricFamily("kvdiag_isolation_auc", "ROC AUC of time to first token, correct vs "
                            "wrong guesses of a secret prefix (0.5: indistinguishable).",
                            labels=(*labels, "config", "length"))
    cached = GaugeMetricFamily("kvdiag_isolation_cached_tokens", "Mean cached tokens of the "
                               "attacker's correct or wrong guesses.",
                               labels=(*labels, "config", "length", "guess"))
    seen = set()
    for r in rows:
        who = [str(r.model), str(r.target)]
        if tuple(who) not in seen:
            seen.add(tuple(who))
            passed.add_metric(who, 1.0 if r.verdict.passed else 0.0)
        cell = [*who, str(r.config), str(r.length)]
        if r.auc is not None:
            auc.add_metric(cell, r.auc)
        for guess, v in (("correct", r.cached_correct), ("wrong", r.cached_wrong)):
            if v is not None:
                cached.add_metric([*cell, guess], v)
    yield from (passed, auc, cached)


def render(history: Path, suite: str | None = None) -> bytes:
    """The exposition text (Prometheus text format 0.0.4)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HistoryCollector(history, suite))
    return generate_latest(registry)


def write_textfile(directory: Path, history: Path, suite: str | None = None,
                   name: str = TEXTFILE_NAME) -> Path:
    """DIRECTORY/kvdiag.prom for node_exporter's textfile collector: written to a dot-file
    the collector ignores, synced, then renamed over the old one (never read half-written).
    A missing history is refused (FileNotFoundError)."""
    if not Path(history).exists():
        raise KvdiagError(f"{history}: no history yet (kvdiag regress --history {history} makes one)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path, tmp = directory / name, directory / f".{name}.{os.getpid()}.tmp"
    data = render(history, suite)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def start_exporter(port: int, history: Path, addr: str = "127.0.0.1", suite: str | None = None):
    """Serve /metrics on addr:port in a background thread; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HistoryCollector(history, suite))
    return start_http_server(port, addr=addr, registry=registry)


def serve_forever(port: int, history: Path, addr: str = "127.0.0.1", suite: str | None = None,
                  announce: Callable[[str], None] = print) -> None:
    """start_exporter, tell `announce` its URL, and serve until interrupted (Ctrl-C stops
    the server and returns)."""
    import threading

    server, _ = start_exporter(port, history, addr=addr, suite=suite)
    announce(f"http://{addr}:{server.server_port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
