"""The HTML report: built from a real `kvdiag reproduce` run and opened in headless
Chromium; synthetic runs (realistic shapes: a guarded allocator that stays flat, a buggy one
that decays from round 4, flat ablations, a run history) cover what one run cannot."""

from __future__ import annotations

import os
import random
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from kvdiag.errors import KvdiagError
from kvdiag.metrics.decay import per_round, summarize
from kvdiag.record.environment import describe_environment
from kvdiag.report import render_report, write_report
from kvdiag.report.meaning import rerun_command
from tests.kvdiag.summaries import reproduce

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

CHROMIUM = Path("/usr/bin/chromium")
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi")
RERUN = "kvdiag reproduce --suite suites/reproduce.yaml --allocators buggy,guarded"
COMMAND = f"{RERUN} --out x"
GATES = {"trigger/guarded": {"passed": True, "failures": []}}


def synthetic_results(sessions: int = 16, rounds: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    plan = [("trigger", a) for a in ("contiguous", "guarded", "buggy")] + [
        (case, a) for case in ("no-caching", "no-recycling") for a in ("contiguous", "buggy")]
    for case, allocator in plan:
        for s in range(sessions):
            for r in range(1, rounds + 1):
                recite = (s + r) % 3 == 0
                ref_ids = [rng.randrange(1000) for _ in range(30 if recite else 2)]
                ref_text = " ".join(WORDS[i % len(WORDS)] for i in ref_ids)
                corrupt = (case == "trigger" and allocator == "buggy"
                           and rng.random() < min(1.0, max(0.0, (r - 3) * 0.13)))
                out_ids = list(ref_ids)
                first = None
                if corrupt:
                    first = rng.randrange(len(ref_ids))
                    out_ids[first:] = [(i + 7) % 1000 for i in ref_ids[first:]]
                needed = 256 + 24 * r
                cached = 0 if allocator == "contiguous" or case == "no-caching" else needed - 24
                rows.append({
                    "case": case, "target": "reference", "allocator": allocator,
                    "session": f"s{s:02d}", "round": r,
                    "kind": "recite" if recite else "question",
                    "prompt_tokens": needed * 16, "cached_tokens": cached * 16,
                    "blocks_needed": needed,
                    "blocks_hit": cached + (12 if allocator == "buggy" and r > 3 and cached else 0),
                    "attention_leakage": rng.uniform(0.05, 0.3) if corrupt else 0.0,
                    "attention_leakage_max": rng.uniform(0.4, 0.9) if corrupt else 0.0,
                    "foreign_slots": rng.randrange(16, 64) if corrupt else 0,
                    "unwritten_slots": 0,
                    "guard_rejections": 2 if allocator == "guarded" and r > 3 else 0,
                    "nonfinite_logits": 0, "preemptions": 1 if r % 5 == 0 else 0,
                    "output_text": " ".join(WORDS[i % len(WORDS)] for i in out_ids),
                    "reference_text": ref_text,
                    "output_token_ids": out_ids, "reference_token_ids": ref_ids,
                    "first_divergence": first,
                    "fact_check_pass": float("nan") if recite else (0.0 if corrupt else 1.0),
                })
    df = pd.DataFrame(rows)
    df["first_divergence"] = df["first_divergence"].astype("Int64")
    return df


def write_run(run_dir: Path, results: pd.DataFrame, verdict: str = "fail", **extra) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    results.to_parquet(run_dir / "results.parquet")
    summary = reproduce(**extra, verdict=verdict, wall_seconds=41.7, command=COMMAND,
                        created="2025-11-29T10:00:00+00:00", targets=["reference"],
                        cases=list(dict.fromkeys(results["case"])), **summarize(results).fields())
    (run_dir / "summary.json").write_text(summary.to_json(), encoding="utf-8")
    return run_dir


def history() -> pd.DataFrame:
    rows = []
    for k in range(8):
        for target, base in (("buggy", 0.004), ("guarded", 0.0)):
            sq = base * (1 + k) if target == "buggy" else 0.0
            rows.append({"run_id": f"run{k}", "created": f"2025-11-{10 + k:02d}",
                         "suite": "weekly", "target": target, "sqdr": sq,
                         "brai": 0.01 * k if target == "buggy" else 0.0,
                         "verdict": "fail" if sq > 0.01 else "pass"})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("run"), synthetic_results())
    return write_report(run_dir, history=history())


def test_report_is_self_contained_and_small(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    assert report == report.parent / "report.html"
    assert report.stat().st_size < 2 * 1024 * 1024
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "@import" not in text and "url(http" not in text
    assert text.count("<svg") == 3  # decay curves, heatmap, trend
    assert "FAIL" in text and RERUN in text and "canary-0123abcd" in text
    assert COMMAND not in text  # a rerun must not write into this run's directory
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "duplicate element ids"
    for word in ("no-caching", "no-recycling", "SQDR", "BRAI", "0.005", "0.01", "0.05"):
        assert word in text


def test_every_case_that_departs_gets_its_own_decay_curves(tmp_path: Path) -> None:
    results = synthetic_results(sessions=4, rounds=6)
    long = results[results["case"] == "trigger"].assign(case="long")
    out = write_report(write_run(tmp_path / "run", pd.concat([results, long], ignore_index=True)))
    text = out.read_text(encoding="utf-8")
    assert text.count("<svg") == 3  # main decay curves, the long case's, heatmap
    assert "Decay per round · case long" in text
    assert "Decay per round · case no-caching" not in text  # flat controls get no panels
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "duplicate element ids"


def test_report_without_history_or_leakage(tmp_path: Path) -> None:
    results = synthetic_results(sessions=4, rounds=5)
    results["attention_leakage"] = float("nan")  # a live endpoint: attention not captured
    results["attention_leakage_max"] = float("nan")
    out = write_report(write_run(tmp_path / "run", results, "pass"), tmp_path / "r" / "x.html")
    text = out.read_text(encoding="utf-8")
    assert "PASS" in text and "Trend over runs" not in text
    assert "diverged share of output" in text and "not measured here" in text


def test_missing_run_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(KvdiagError, match="results.parquet"):
        write_report(tmp_path)
    html = render_report(synthetic_results(2, 3), reproduce(suite="smoke"))
    assert "not recorded" in html  # an old summary without `command` still renders


def open_in_chromium(report: Path, shot: Path, verdict_text: str, plots_expected: int,
                     check=None) -> None:
    """Load the page with JavaScript off, screenshot it, and check what an SRE needs."""
    from playwright.sync_api import sync_playwright

    errors, remote = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900},
                                    java_script_enabled=False)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: remote.append(r.url)
                    if r.url.startswith(("http:", "https:")) else None)
            page.goto(report.resolve().as_uri(), wait_until="load")
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            verdict = page.locator("#verdict")
            assert verdict.is_visible() and verdict_text in verdict.inner_text()
            plots = page.locator("figure.plot svg")
            assert plots.count() == plots_expected
            for k in range(plots.count()):
                box = plots.nth(k).bounding_box()
                assert box and box["width"] > 100 and box["height"] > 100, box
            if check:
                check(page)
        finally:
            browser.close()
    assert errors == [], errors
    assert remote == [], remote


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium absent: apt-get install chromium")
def test_synthetic_report_with_history_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    shot = Path(os.environ.get("KVDIAG_ARTIFACTS", tmp_path)) / "report-synthetic.png"
    open_in_chromium(report, shot, "FAIL", 3)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium absent: apt-get install chromium")
def test_report_of_a_real_reproduce_run(reproduce_run, tmp_path: Path) -> None:
    run_dir, summary = reproduce_run
    report = run_dir / "report.html"  # written by reproduce itself
    assert report.stat().st_size < 2 * 1024 * 1024
    text = report.read_text(encoding="utf-8")
    assert summary["signature"] in text and "kvdiag reproduce" in text
    assert "guarded" in text and "buggy" in text
    rebuilt = write_report(run_dir, tmp_path / "again.html")  # `kvdiag report RUN_DIR -o FILE`
    assert rebuilt.stat().st_size > 0
    shot = Path(os.environ.get("KVDIAG_ARTIFACTS", tmp_path)) / "report-reproduce.png"
    open_in_chromium(report, shot, "PASS", 2)


class _Tables(HTMLParser):
    """table id -> rows of cell texts (header row first), with the stdlib parser."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id = self._cell = None

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "table":
            self._id = dict(attrs).get("id")
            self.tables[self._id] = []
        elif tag == "tr" and self._id:
            self.tables[self._id].append([])
        elif tag in ("td", "th") and self._id:
            self._cell = ""

    def handle_data(self, data) -> None:
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._id][-1].append(self._cell.strip())
            self._cell = None
        elif tag == "table":
            self._id = None


def table(html: str, name: str) -> pd.DataFrame:
    parser = _Tables()
    parser.feed(html)
    header, *rows = parser.tables[f"T_{name}"]
    return pd.DataFrame(rows, columns=header)


def test_verdict_is_said_in_words_next_to_the_badge() -> None:
    """The badge and its sentence are the judge's verdict and reason, for every verdict."""
    from kvdiag.record.summary import ReproduceSummary
    from kvdiag.verdicts import Verdict, judge_probe
    from tests.kvdiag.verdicts.test_verdicts import evidence

    results = synthetic_results(sessions=2, rounds=3)
    probe = judge_probe(evidence(divergences=[("2", 5.0), ("3", 5.0), ("3", 9.0)]))
    contaminated = judge_probe(evidence(contaminated=2))
    cases = [(Verdict.PASS, "trigger/guarded stayed flat"), (Verdict.FAIL, probe.reason),
             (Verdict.INCONCLUSIVE, "the trigger was not reached"), (Verdict.ERROR, contaminated.reason)]
    for verdict, reason in cases:
        html = render_report(results, reproduce(verdict=verdict, reason=reason))
        meaning = re.search(r'<p class="meaning" id="verdict-meaning">([^<]*)</p>', html)[1]
        assert meaning.startswith(f"{verdict.value.upper()}: ") and reason[1:] in meaning
        assert f'<header class="verdict-{verdict.value}">' in html
    assert "3 requests answered from the shared prefix cache" in probe.reason
    old = render_report(results, reproduce(verdict="inconclusive"))  # written before `reason` existed
    assert "the trigger was not reproduced or not reached" in old
    assert ".verdict-inconclusive .badge{background:#b7791f" in old  # amber
    assert ".verdict-error .badge{background:#6b21a8" in old
    assert "reason" in ReproduceSummary.model_fields


def test_counts_are_integers_and_the_reference_has_no_brai(tmp_path: Path) -> None:
    html = render_report(synthetic_results(sessions=4, rounds=8), reproduce(verdict="fail"))
    rounds = table(html, "rounds")
    counts = [c for c in rounds.columns if c.startswith("foreign slots")]
    assert counts and all(re.fullmatch(r"\d+", v) for c in counts for v in rounds[c]), rounds
    assert any(int(v) > 0 for v in rounds["foreign slots · buggy"])
    ablations = table(html, "ablations")
    reference = ablations[ablations["allocator / target"] == "contiguous"]
    assert len(reference) == 3 and set(reference["BRAI"]) == {""}
    assert set(reference["BRAI status"]) == {""}
    assert all(re.fullmatch(r"\d+", v) for v in ablations["foreign slots"])
    buggy = ablations[(ablations["allocator / target"] == "buggy") & (ablations["case"] == "trigger")]
    assert re.fullmatch(r"\d\.\d{3}", buggy["BRAI"].iloc[0])  # a cache: its BRAI is shown


def test_no_ablations_section_without_ablations() -> None:
    results = synthetic_results(sessions=2, rounds=3)
    only_main = render_report(results[results["case"] == "trigger"], reproduce())
    assert 'id="ablations"' not in only_main and 'href="#ablations"' not in only_main
    assert "Per-round values" in only_main  # still there, under the decay curves
    assert 'id="ablations"' in render_report(results, reproduce())


def test_curves_carry_hover_titles_and_leave_the_reference_out_of_reuse() -> None:
    results = synthetic_results(sessions=2, rounds=3)
    main = results[results["case"] == "trigger"]
    html = render_report(main, reproduce())
    decay = html[html.index('<section id="decay">'):html.index('<section id="alerts">')]
    titles = re.findall(r"<title>([^<]*)</title>", decay)
    rows = per_round(main.assign())
    finite = sum(rows[c].notna().sum() for c in ("fact_check_pass_rate", "bleu4",
                                                  "attention_leakage", "block_reuse_rate"))
    no_reuse = int((rows["allocator"] == "contiguous").sum())  # reference left out of reuse
    assert len(titles) == finite - no_reuse
    assert not [t for t in titles if t.startswith("contiguous") and "block reuse" in t]
    assert [t for t in titles if t.startswith("contiguous") and "fact-check" in t]
    one = rows[(rows["allocator"] == "buggy") & (rows["round"] == 3)].iloc[0]
    assert f"buggy · round 3 · BLEU-4: {one['bleu4']:.4g}" in titles
    assert "<script" not in html.lower()


def test_signature_and_environment_are_shown(tmp_path: Path) -> None:
    environment = describe_environment()
    out = write_report(write_run(tmp_path / "run", synthetic_results(2, 3), "pass",
                                 environment=environment))
    text = out.read_text(encoding="utf-8")
    assert "canary-0123abcd" in text and '<details id="environment">' in text
    assert f"<dt>torch</dt><dd>{environment.packages['torch']}</dd>" in text
    if environment.git:
        assert environment.git.commit in text
    assert '<details id="environment">' not in render_report(synthetic_results(2, 3), reproduce())


def test_rerun_command_never_names_the_old_run_directory() -> None:
    assert rerun_command(COMMAND) == RERUN
    assert rerun_command("kvdiag probe --out=r1 --url http://h:8000") == (
        "kvdiag probe --url http://h:8000")
    assert rerun_command("kvdiag reproduce --out 'my run' --json") == "kvdiag reproduce --json"
    assert rerun_command(None) is None


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium absent: apt-get install chromium")
def test_inconclusive_report_in_headless_chromium(tmp_path: Path) -> None:
    out = write_report(write_run(tmp_path / "run", synthetic_results(3, 4), "inconclusive",
                                 gates=GATES, faults={"trigger/buggy": []}))
    shot = Path(os.environ.get("KVDIAG_ARTIFACTS", tmp_path)) / "report-inconclusive.png"

    def amber_with_words_and_hover_titles(page) -> None:
        badge = page.locator("#verdict .badge")
        assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(183, 121, 31)"
        meaning = page.locator("#verdict-meaning")
        assert meaning.is_visible() and "not reproduced" in meaning.inner_text()
        assert page.locator("#decay svg title").count() > 0
        assert page.locator("#ablations").count() == 1  # three cases: ablations shown

    open_in_chromium(out, shot, "INCONCLUSIVE", 2, amber_with_words_and_hover_titles)
