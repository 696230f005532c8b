"""Prometheus export of the run history: the textfile (atomic, parses), the HTTP exporter
(in-process and `kvdiag exporter` as a subprocess), the alert rules (promtool check and
promtool test, where promtool is installed) and the Grafana dashboard."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kvdiag.export.prometheus import latest_runs, start_exporter
from kvdiag.metrics.decay import SQDR_ALERT
from kvdiag.paths import REPO_ROOT
from kvdiag.regress import history as H
from kvdiag.vocab import BRAI_MAX as BRAI_ALERT
from tests.kvdiag.regress_cli import command, make_app
from tests.kvdiag.serving import free_port

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

RULES = REPO_ROOT / "deploy" / "prometheus" / "kvdiag-rules.yaml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "kvdiag.json"
LABELS = {"model_name", "engine", "suite", "target"}


def _run(run_id: str, target: str, created: str, verdict: str, fact: list[float], **kw) -> tuple:
    row = {"run_id": run_id, "created": created, "suite": "weekly", "target": target,
           "series": target.split(":")[-1], "engine": "reference", "engine_version": "0.1.0",
           "model": "canary-397f8e10", "key_id": "k", "key_json": "{}", "signature": f"kvdiag:0.1.0|{run_id}",
           "verdict": verdict, "run_verdict": "pass", "main_case": "canary", "sqdr": kw.get("sqdr", 0.0),
           "brai": kw.get("brai", 0.0), "block_reuse_rate": 0.9, "attention_leakage": kw.get("leak", 0.0),
           "divergence_ratio": kw.get("div", 0.0), "wall_seconds": 1.0, "run_dir": "reports/x"}
    rounds = [{"case": "canary", "round": i + 1, "fact_check_pass_rate": f, "bleu4": 100.0 * f,
               "block_reuse_rate": 0.9, "brai": 0.0, "attention_leakage": 0.0, "divergence_ratio": 0.0,
               "foreign_slots": 0, "unwritten_slots": 0, "nonfinite_logits": 0} for i, f in enumerate(fact)]
    return row, rounds


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "history.sqlite"
    for row, rounds in (
        _run("g1", "reference:guarded", "2026-01-05T03:00:00+00:00", "pass", [1.0] * 10),
        _run("g2", "reference:guarded", "2026-01-12T03:00:00+00:00", "pass", [1.0] * 10),
        _run("b1", "reference:buggy", "2026-01-12T04:00:00+00:00", "fail", [1.0, 1.0, 0.9, 0.8, 0.7, 0.8, 0.6, 0.7, 0.6, 0.5],
             sqdr=0.05, brai=0.07, leak=0.03, div=0.4),
    ):
        H.append(path, row, rounds, [])
    return path


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _check_families(families: dict) -> None:
    for name in ("kvdiag_sqdr", "kvdiag_brai", "kvdiag_fact_check_pass_ratio", "kvdiag_bleu4",
                 "kvdiag_attention_leakage", "kvdiag_cache_divergence_ratio"):
        assert name in families and families[name].samples, name
        for sample in families[name].samples:
            assert set(sample.labels) >= LABELS
    sqdr = {s.labels["target"]: s.value for s in families["kvdiag_sqdr"].samples}
    assert sqdr == {"reference:guarded": 0.0, "reference:buggy": 0.05}  # the latest run of each
    buggy = {int(s.labels["round"]): s.value for s in families["kvdiag_fact_check_pass_ratio"].samples
             if s.labels["target"] == "reference:buggy"}
    assert buggy[1] == 1.0 and buggy[10] == 0.5 and len(buggy) == 10
    info = [s for s in families["kvdiag_run_info"].samples if s.labels["target"] == "reference:guarded"]
    assert [s.labels["run_id"] for s in info] == ["g2"]


def test_latest_runs(history):
    runs = latest_runs(history)
    assert sorted(r.run_id for r in runs) == ["b1", "g2"]
    assert all(len(r.rounds) == 10 for r in runs)


def test_textfile_is_written_atomically_and_parses(history, tmp_path):
    out = tmp_path / "textfile"
    result = CliRunner().invoke(make_app(), ["export", "--textfile", str(out), "--history", str(history)])
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["kvdiag.prom"]  # no temporary file left behind
    _check_families(_families((out / "kvdiag.prom").read_text()))


def test_export_without_history_exits_2(tmp_path):
    result = CliRunner().invoke(make_app(), ["export", "--textfile", str(tmp_path), "--history",
                                             str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2 and "no history yet" in result.output


def test_a_missing_history_is_a_metric_an_alert_fires_on(tmp_path):
    """No history file: the exporter still serves kvdiag_history_present 0 (and 1 once a run
    is recorded), and the rule KvdiagHistoryMissing watches it."""
    from kvdiag.export.prometheus import render

    missing = _families(render(tmp_path / "none.sqlite").decode())
    assert [s.value for s in missing["kvdiag_history_present"].samples] == [0.0]
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert rules["KvdiagHistoryMissing"]["expr"] == "kvdiag_history_present == 0"


def test_exporter_serves_parsable_metrics(history):
    server, thread = start_exporter(0, history, addr="127.0.0.1")
    try:
        r = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert r.status_code == 200
    _check_families(_families(r.text))


def test_exporter_command(history):
    port = free_port()
    proc = subprocess.Popen(command("exporter", "--port", str(port), "--addr", "127.0.0.1", "--history",
                                    str(history)), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline, text = time.monotonic() + 60, None
        while text is None:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.TransportError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    _check_families(_families(text))


def test_rules_match_the_code():
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    sqdr, brai = rules["KvdiagSessionQualityDecay"], rules["KvdiagBlockReuseAnomaly"]
    assert sqdr["expr"] == f"kvdiag_sqdr > {SQDR_ALERT}" and sqdr["for"] == "5m"
    assert brai["expr"] == f"kvdiag_brai > {BRAI_ALERT}"
    watch_sqdr, over_hit = rules["KvdiagWatchSessionQualityDecay"], rules["KvdiagWatchOverHit"]
    assert watch_sqdr["expr"] == f"kvdiag_watch_sqdr > {SQDR_ALERT}" and watch_sqdr["for"] == "5m"
    assert over_hit["expr"] == "increase(kvdiag_watch_over_hits_total[5m]) > 0"
    for rule in rules.values():
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        doc, anchor = rule["annotations"]["runbook_url"].split("#")
        assert doc in ("docs/regression.md", "docs/watch.md")
        assert f"name=\"{anchor}\"" in (REPO_ROOT / doc).read_text()


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (make promtool: Debian's prometheus)")


@needs_promtool
def test_promtool_checks_the_rules():
    run = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(rules)} rules found" in run.stdout  # promtool read every rule


def _annotations(alert: str, value: str, labels: dict | None = None) -> dict:
    """The rule's annotations as Prometheus renders them for the test series below (the
    templates used here are only $labels.X and `$value | printf "%.4f"`)."""
    import re

    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == alert)
    labels = labels or {"model_name": "m", "engine": "vllm", "suite": "weekly",
                        "target": "http://gpu-01:8000"}

    def render(text: str) -> str:
        text = re.sub(r"\{\{ \$value \| printf \"%\.4f\" \}\}", value, text)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)

    return {k: render(v) for k, v in rule["annotations"].items()}


@needs_promtool
def test_promtool_rule_tests(tmp_path):
    """SQDR 0.02 fires after 5 minutes, 0.004 never; BRAI 0.07 fires at once."""
    labels = 'model_name="m",engine="vllm",suite="weekly",target="http://gpu-01:8000"'
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f"kvdiag_sqdr{{{labels}}}", "values": "0.02x10"},
            {"series": f'kvdiag_sqdr{{{labels.replace("gpu-01", "gpu-02")}}}', "values": "0.004x10"},
            {"series": f"kvdiag_brai{{{labels}}}", "values": "0.07x10"},
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "KvdiagSessionQualityDecay", "exp_alerts": []},
            {"eval_time": "7m", "alertname": "KvdiagSessionQualityDecay", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "model_name": "m", "engine": "vllm",
                               "suite": "weekly", "target": "http://gpu-01:8000"},
                "exp_annotations": _annotations("KvdiagSessionQualityDecay", "0.0200")}]},
            {"eval_time": "1m", "alertname": "KvdiagBlockReuseAnomaly", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "model_name": "m", "engine": "vllm",
                               "suite": "weekly", "target": "http://gpu-01:8000"},
                "exp_annotations": _annotations("KvdiagBlockReuseAnomaly", "0.0700")}]},
        ],
    }, {
        "interval": "1m",  # kvdiag watch: an SQDR held 5 minutes fires, one over-hit fires
        "input_series": [
            {"series": 'kvdiag_watch_sqdr{instance="proxy:8100"}', "values": "0.03x10"},
            {"series": 'kvdiag_watch_over_hits_total{instance="proxy:8100"}', "values": "0 0 0 1 1 1 1 1 1 1 1"},
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "KvdiagWatchSessionQualityDecay", "exp_alerts": []},
            {"eval_time": "7m", "alertname": "KvdiagWatchSessionQualityDecay", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "instance": "proxy:8100"},
                "exp_annotations": _annotations("KvdiagWatchSessionQualityDecay", "0.0300",
                                                {"instance": "proxy:8100"})}]},
            {"eval_time": "2m", "alertname": "KvdiagWatchOverHit", "exp_alerts": []},
            {"eval_time": "4m", "alertname": "KvdiagWatchOverHit", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "instance": "proxy:8100"},
                "exp_annotations": _annotations("KvdiagWatchOverHit", "1", {"instance": "proxy:8100"})}]},
        ],
    }]}
    path = tmp_path / "rules-test.yaml"
    path.write_text(yaml.safe_dump(tests))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_grafana_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in ("kvdiag_fact_check_pass_ratio", "kvdiag_sqdr", "kvdiag_brai", "kvdiag_cache_divergence_ratio",
                 "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        assert name in exprs, name
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "kvdiag-regression"
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "suite", "model_name"}


def test_the_watch_dashboard_reads_every_watch_metric_the_proxy_serves():
    from kvdiag.watch.metrics import WatchMetrics

    served = {line.split()[0].split("{")[0] for line in WatchMetrics().render().decode().splitlines()
              if line and not line.startswith("#") and not line.split()[0].endswith("_created")}
    dash = json.loads((REPO_ROOT / "deploy" / "grafana" / "kvdiag-watch.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    missing = {m for m in served if m.replace("_total", "") not in exprs}
    assert not missing and dash["uid"] == "kvdiag-watch"


SCHEMA_1 = """
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY, created TEXT NOT NULL, suite TEXT NOT NULL, target TEXT NOT NULL,
  series TEXT, engine TEXT, engine_version TEXT, model TEXT, key_id TEXT, key_json TEXT,
  baseline_key_id TEXT, signature TEXT, verdict TEXT NOT NULL, run_verdict TEXT,
  main_case TEXT, sqdr REAL, brai REAL, block_reuse_rate REAL, attention_leakage REAL,
  divergence_ratio REAL, wall_seconds REAL, run_dir TEXT, command TEXT, kvdiag_version TEXT);
CREATE TABLE rounds (
  run_id TEXT NOT NULL REFERENCES runs (run_id), case_name TEXT NOT NULL, round INTEGER NOT NULL,
  fact_check_pass_rate REAL, bleu4 REAL, block_reuse_rate REAL, brai REAL,
  attention_leakage REAL, divergence_ratio REAL, foreign_slots INTEGER,
  unwritten_slots INTEGER, nonfinite_logits INTEGER, PRIMARY KEY (run_id, case_name, round));
CREATE TABLE checks (
  run_id TEXT NOT NULL REFERENCES runs (run_id), case_name TEXT, metric TEXT NOT NULL,
  round INTEGER, value REAL, baseline REAL, limit_value REAL, message TEXT);
"""  # the history as kvdiag wrote it before isolation audits were recorded


def test_a_schema_1_history_gains_the_isolation_table(tmp_path):
    """A history written before isolation audits were recorded opens, migrates to the
    current schema in place, and keeps its runs."""
    import sqlite3

    from kvdiag.regress import history as H

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as con:
        con.executescript(SCHEMA_1)
        con.execute("INSERT INTO runs (run_id, created, suite, target, verdict) VALUES "
                    "('r1', '2026-11-01T00:00:00+00:00', 'weekly', 'reference:guarded', 'pass')")
        con.execute("PRAGMA user_version=1")
    H.connect(path).close()
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == H.SCHEMA == 5
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("r1",)]
        assert con.execute("SELECT COUNT(*) FROM isolation").fetchone()[0] == 0
        assert con.execute("SELECT COUNT(*) FROM baselines").fetchone()[0] == 0
    assert H.latest_isolation(path) == []


def test_a_history_written_by_the_previous_release_migrates_and_keeps_its_verdicts(tmp_path):
    """tests/fixtures/history-schema2.sqlite was written by the release before the one
    verdict (schema 2): a buggy allocator on a pool that never recycled recorded as "pass"
    (run_verdict "inconclusive"), and a guarded run. It opens, gains `reason`, keeps both
    rows as they were, and takes a new run beside them."""
    import shutil
    import sqlite3

    from kvdiag.regress import history as H

    path = tmp_path / "history.sqlite"
    shutil.copy(Path(__file__).resolve().parents[2] / "fixtures" / "history-schema2.sqlite", path)
    before = H.runs(path)
    assert list(before["verdict"]) == ["pass", "pass"]
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == H.SCHEMA  # runs() migrated it
        columns = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    assert columns[-2:] == ["reason", "events"]
    after = H.runs(path)
    assert list(after["run_verdict"]) == ["inconclusive", "pass"] and after["reason"].isna().all()
    row = {c: before.iloc[1][c] for c in H.RUN_COLUMNS if c in before} | {
        "run_id": "new", "created": "2026-12-31T00:00:00+00:00", "verdict": "inconclusive",
        "reason": "the trigger was not reached"}
    H.append(path, row, [], [])
    assert list(H.runs(path)["verdict"]) == ["pass", "pass", "inconclusive"]
