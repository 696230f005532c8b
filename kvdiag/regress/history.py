"""The run history: one SQLite file (WAL journal, synchronous=FULL), one transaction per run,
schema versioned with PRAGMA user_version. A run killed at any point, even inside its own
transaction, leaves every earlier run intact: SQLite rolls the open transaction back on the
next open, and the run's own directory still holds what it measured.

    runs      one row per run: identity (suite, target, engine, version, model, key),
              verdicts (pass, fail, inconclusive or error) and why (`reason`, schema 3),
              run-level SQDR / BRAI / reuse / leakage / divergence of the main case
    rounds    per case and round: the series under test's metrics and BRAI
    checks    every failed check of the run (metric, round, value, baseline, limit)
    isolation one row per (isolation audit, configuration, prefix length): verdict, AUC,
              p-value, cached tokens of correct / wrong guesses (schema 2)
    baselines one row per `kvdiag baseline update`: the run made the baseline of its key, its
              verdict, and whether --force took a run that did not pass (schema 4)
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvdiag.record.summary import IsolationSummary
    from kvdiag.regress.compare import Check

SCHEMA = 5
DEFAULT_PATH = Path("reports/history.sqlite")
# Test hook, for tests/kvdiag/commands/test_regress.py only: when set to a file path, append() creates
# that file inside its open transaction and sleeps, so a test can SIGKILL the process mid-write.
PAUSE_ENV = "KVDIAG_TEST_HISTORY_PAUSE"

_DDL = """
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY, created TEXT NOT NULL, suite TEXT NOT NULL, target TEXT NOT NULL,
  series TEXT, engine TEXT, engine_version TEXT, model TEXT, key_id TEXT, key_json TEXT,
  baseline_key_id TEXT, signature TEXT, verdict TEXT NOT NULL, run_verdict TEXT,
  main_case TEXT, sqdr REAL, brai REAL, block_reuse_rate REAL, attention_leakage REAL,
  divergence_ratio REAL, wall_seconds REAL, run_dir TEXT, command TEXT, kvdiag_version TEXT,
  reason TEXT, events TEXT);
CREATE INDEX runs_suite_created ON runs (suite, created);
CREATE TABLE rounds (
  run_id TEXT NOT NULL REFERENCES runs (run_id), case_name TEXT NOT NULL, round INTEGER NOT NULL,
  fact_check_pass_rate REAL, bleu4 REAL, block_reuse_rate REAL, brai REAL,
  attention_leakage REAL, divergence_ratio REAL, foreign_slots INTEGER,
  unwritten_slots INTEGER, nonfinite_logits INTEGER, PRIMARY KEY (run_id, case_name, round));
CREATE TABLE checks (
  run_id TEXT NOT NULL REFERENCES runs (run_id), case_name TEXT, metric TEXT NOT NULL,
  round INTEGER, value REAL, baseline REAL, limit_value REAL, message TEXT);
""" + """
CREATE TABLE isolation (
  run_id TEXT NOT NULL, created TEXT NOT NULL, target TEXT NOT NULL, model TEXT, verdict TEXT NOT NULL,
  config TEXT NOT NULL, length INTEGER NOT NULL, auc REAL, p_value REAL, cached_correct REAL,
  cached_wrong REAL, leaks INTEGER, run_dir TEXT, PRIMARY KEY (run_id, config, length));
""" + """
CREATE TABLE baselines (
  created TEXT NOT NULL, baseline_file TEXT NOT NULL, key_id TEXT NOT NULL, run_id TEXT NOT NULL,
  verdict TEXT NOT NULL, forced INTEGER NOT NULL, reason TEXT);
"""
RUN_COLUMNS = ("run_id", "created", "suite", "target", "series", "engine", "engine_version",
               "model", "key_id", "key_json", "baseline_key_id", "signature", "verdict",
               "run_verdict", "main_case", "sqdr", "brai", "block_reuse_rate",
               "attention_leakage", "divergence_ratio", "wall_seconds", "run_dir", "command",
               "kvdiag_version", "reason", "events")
ROUND_COLUMNS = ("fact_check_pass_rate", "bleu4", "block_reuse_rate", "brai", "attention_leakage",
                 "divergence_ratio", "foreign_slots", "unwritten_slots", "nonfinite_logits")
MIGRATIONS: dict[int, str] = {  # from version N to N + 1; older rows keep their verdicts
    1: _DDL[_DDL.index("CREATE TABLE isolation"):_DDL.index("CREATE TABLE baselines")],
    2: "ALTER TABLE runs ADD COLUMN reason TEXT",
    3: _DDL[_DDL.index("CREATE TABLE baselines"):],
    4: "ALTER TABLE runs ADD COLUMN events TEXT",  # a live run's coverage: events reached, missing
}
ISOLATION_COLUMNS = ("run_id", "created", "target", "model", "verdict", "config", "length", "auc",
                     "p_value", "cached_correct", "cached_wrong", "leaks", "run_dir")


def connect(path: Path, create: bool = True) -> sqlite3.Connection:
    """Open (creating or migrating) the history; KvdiagError names a bad or newer file."""
    path = Path(path)
    if not create and not path.exists():
        raise KvdiagError(f"{path}: no history yet (kvdiag regress --history {path} makes one)")
    path.parent.mkdir(parents=True, exist_ok=True)
    con = None
    try:
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA:
            raise KvdiagError(f"{path}: history schema {version} is newer than this kvdiag's ({SCHEMA})")
        if version < SCHEMA:
            con.execute("BEGIN IMMEDIATE")  # another process may have created it meanwhile
            version = con.execute("PRAGMA user_version").fetchone()[0]
            steps = [_DDL] if version == 0 else [MIGRATIONS[v] for v in range(version, SCHEMA)]
            for statement in (s for step in steps for s in step.split(";") if s.strip()):
                con.execute(statement)
            con.execute(f"PRAGMA user_version={SCHEMA}")
            con.execute("COMMIT")
    except (sqlite3.DatabaseError, KvdiagError) as e:
        if con is not None:
            con.close()
        if isinstance(e, KvdiagError):
            raise
        raise KvdiagError(f"{path}: not a readable kvdiag history ({e})") from None
    return con


def append(path: Path, run: dict, rounds: list[dict], failed_checks: Sequence[Check]) -> None:
    """One run (a `runs` row: RUN_COLUMNS), its rounds (`rounds` rows: case, round and
    ROUND_COLUMNS) and its failed checks (kvdiag.regress.compare.Check), in one transaction."""
    con = connect(path)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(RUN_COLUMNS))})", [run.get(c) for c in RUN_COLUMNS])
        con.executemany(
            f"INSERT INTO rounds (run_id, case_name, round, {', '.join(ROUND_COLUMNS)}) VALUES "
            f"({', '.join('?' * (3 + len(ROUND_COLUMNS)))})",
            [[run["run_id"], r["case"], r["round"], *(r.get(c) for c in ROUND_COLUMNS)] for r in rounds])
        con.executemany(
            "INSERT INTO checks (run_id, case_name, metric, round, value, baseline, limit_value, "
            "message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [[run["run_id"], c.case, c.metric, c.round, c.value, c.baseline, c.limit, c.message]
             for c in failed_checks])
        if os.environ.get(PAUSE_ENV):  # test hook (see PAUSE_ENV): the kill lands here
            Path(os.environ[PAUSE_ENV]).write_text(run["run_id"])
            time.sleep(600)
        con.execute("COMMIT")
    except sqlite3.IntegrityError as e:
        con.execute("ROLLBACK")
        raise KvdiagError(f"{path}: run {run['run_id']} cannot be stored ({e})") from None
    finally:
        con.close()


def record_baseline(path: Path, row: dict) -> None:
    """One `kvdiag baseline update` (created, baseline_file, key_id, run_id, verdict, forced,
    reason), so a baseline forced from a run that did not pass stays on record."""
    columns = ("created", "baseline_file", "key_id", "run_id", "verdict", "forced", "reason")
    con = connect(path)
    try:
        con.execute(f"INSERT INTO baselines ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                    [row[c] for c in columns])
    finally:
        con.close()


def unique_run_id(path: Path, wanted: str) -> str:
    if not Path(path).exists():
        return wanted
    con = connect(path)
    try:
        taken = {r[0] for r in con.execute("SELECT run_id FROM runs WHERE run_id LIKE ?", (wanted + "%",))}
    finally:
        con.close()
    n, run_id = 1, wanted
    while run_id in taken:
        n += 1
        run_id = f"{wanted}-{n}"
    return run_id


def runs(path: Path, suite: str | None = None, target: str | None = None, last: int | None = None):
    """The runs as a DataFrame, oldest first (the last `last` of them)."""
    import pandas as pd

    con = connect(path, create=False)
    try:
        where, args = [], []
        for column, value in (("suite", suite), ("target", target)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created DESC, rowid DESC" + (f" LIMIT {int(last)}" if last else "")
        frame = pd.read_sql_query(sql, con, params=args)
    finally:
        con.close()
    return frame.iloc[::-1].reset_index(drop=True)


def trend(path: Path, run_dir: Path, last: int = 52):
    """The last `last` runs of RUN_DIR's suite: the trend a run's report shows."""
    from kvdiag.record.rundir import load_summary

    return runs(path, suite=load_summary(run_dir).suite, last=last)


def rounds_of(path: Path, run_ids: list[str]):
    import pandas as pd

    con = connect(path, create=False)
    try:
        marks = ", ".join("?" * len(run_ids))
        return pd.read_sql_query(f"SELECT * FROM rounds WHERE run_id IN ({marks}) "
                                 "ORDER BY run_id, case_name, round", con, params=run_ids)
    finally:
        con.close()


def integrity(path: Path) -> str:
    con = connect(path, create=False)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def append_isolation(path: Path, summary: IsolationSummary, run_dir: Path) -> None:
    """One isolation audit (its stamped summary), a row per (configuration, prefix length), in
    one transaction; the exporter publishes the newest audit of each target and model."""
    run_id = f"isolation-{Path(run_dir).name}"
    rows = [{"run_id": run_id, "created": summary.created, "target": summary.target,
             "model": summary.model, "verdict": summary.verdict.value, "config": c.config,
             "length": c.length, "auc": c.auc, "p_value": c.p_value,
             "cached_correct": c.cached_correct_mean, "cached_wrong": c.cached_wrong_mean,
             "leaks": int(bool(c.leaks)), "run_dir": str(Path(run_dir).resolve())}
            for c in summary.isolation.cells]
    con = connect(path)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.executemany(f"INSERT OR REPLACE INTO isolation ({', '.join(ISOLATION_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(ISOLATION_COLUMNS))})",
                        [[r[c] for c in ISOLATION_COLUMNS] for r in rows])
        con.execute("COMMIT")
    finally:
        con.close()


def latest_isolation(path: Path) -> list[dict]:
    """The rows of the newest isolation audit of each (target, model)."""
    con = connect(path, create=False)
    try:
        con.row_factory = sqlite3.Row
        return [dict(r) for r in con.execute(
            "SELECT i.* FROM isolation i JOIN (SELECT target, model, MAX(created) AS created "
            "FROM isolation GROUP BY target, model) n ON i.target = n.target AND "
            "i.model IS n.model AND i.created = n.created ORDER BY i.target, i.config, i.length")]
    finally:
        con.close()

