"""One self-contained HTML page per run: verdict, decay curves, heatmap, ablations, trend.

No scripts, fonts, stylesheets or images are loaded from anywhere: plots are inline SVG,
styles an inline <style>, and the page reads the same without JavaScript.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError
from kvdiag.metrics.decay import REFERENCE_ALLOCATORS
from kvdiag.record.environment import Environment
from kvdiag.record.evidence import SessionsFile
from kvdiag.record.summary import (
    AuditSummary,
    CompareSummary,
    IsolationSummary,
    MatrixSummary,
    ProbeSummary,
    ReproduceSummary,
    Summary,
)
from kvdiag.record.summary_rows import CaseMetrics
from kvdiag.report import compare, isolation, matrix
from kvdiag.report.style import CSS as _CSS  # shared with the isolation page
from kvdiag.verdicts.findings import departure_rounds

if TYPE_CHECKING:
    from pandas import DataFrame

RunSummary = ReproduceSummary | ProbeSummary | AuditSummary  # the runs measured round by round
# the kinds with a page of their own, drawn from their summary alone
OWN_PAGES = {IsolationSummary: isolation.page, MatrixSummary: matrix.page, CompareSummary: compare.page}

MAX_HEATMAPS = 4

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ verdict }} · kvdiag {{ suite }}</title><style>{{ css }}</style></head>
<body>
<header class="verdict-{{ verdict|lower }}">
<h1 id="verdict"><span class="badge">{{ verdict }}</span>kvdiag · suite {{ suite }}</h1>
<p class="meaning" id="verdict-meaning">{{ meaning }}</p>
<dl class="meta">
<dt>targets</dt><dd>{{ targets }}</dd><dt>cases</dt><dd>{{ cases }}</dd>
<dt>signature</dt><dd><code>{{ signature }}</code></dd>
<dt>created</dt><dd>{{ created }}</dd><dt>wall time</dt><dd>{{ wall }}</dd>
<dt>BLEU</dt><dd><code>{{ bleu_signature }}</code></dd>
{% if sessions_note %}<dt>sessions</dt><dd id="sessions-file">{{ sessions_note }}</dd>{% endif %}
</dl>
{% if withheld %}<p class="note" id="text-withheld">Text withheld (--no-text): this run's files
hold token counts, metrics and hashes, and no prompt or answer text.</p>{% endif %}
{% if environment %}<details id="environment"><summary>Environment</summary>
<dl class="meta">{% for key, value in environment %}<dt>{{ key }}</dt><dd>{{ value }}</dd>
{% endfor %}</dl></details>{% endif %}
<p>Rerun with (writes a new run directory):</p><pre><code>{{ command }}</code></pre>
</header>
<nav><a href="#decay">decay curves</a><a href="#alerts">SQDR / BRAI</a>
<a href="#heatmap">heatmap</a>{% if ablation_table %}<a href="#ablations">ablations</a>{% endif %}
{% if trend %}<a href="#trend">trend</a>{% endif %}</nav>
<section id="decay"><h2>Decay per round · case {{ main_case }}</h2>
<figure class="plot">{{ decay_svg }}
<figcaption>One line per allocator or target; the contiguous reference (ground truth, no
paging) is the black dashed line on a grey band. A dotted vertical line and a ring mark the round where a
series' outputs first depart from the reference's. The reference has no cache, so the
block reuse panel leaves it out. Hover over a point for its value.</figcaption></figure>
<details><summary>Per-round values · case {{ main_case }}</summary>{{ rounds_table }}</details>
</section>
{% for case, svg in other_decay %}<section id="decay-{{ case }}"><h2>Decay per round · case {{ case }}</h2>
<figure class="plot">{{ svg }}<figcaption>Drawn because a series departs from the reference in
this case too; the same encoding as above.</figcaption></figure></section>{% endfor %}
{% if events_table %}<section id="events"><h2>Lifecycle coverage</h2>
<p class="note">The events of a block's life this probe drove, whether each was reached, the
server's own evidence (else what the traffic observed), and the requests exposed to it. A PASS
covers only the events reached.</p>
{{ events_table }}</section>{% endif %}
<section id="alerts"><h2>SQDR and BRAI · case {{ main_case }}</h2>
<p class="note">SQDR = (pass rate at round 1 − pass rate at round n) / n: healthy ≤ 0.005,
alert &gt; 0.01. BRAI = |block reuse rate − the guarded baseline's|: alert &gt; 0.05.</p>
{{ alert_table }}</section>
<section id="heatmap"><h2>{{ heat_title }} by session × round · case {{ main_case }}</h2>
{% if heat_svg %}<figure class="plot">{{ heat_svg }}<figcaption>{{ heat_caption }}</figcaption>
</figure>{% else %}<p class="note">No rows to draw.</p>{% endif %}</section>
{% if ablation_table %}<section id="ablations"><h2>Ablations</h2>
<p class="note">One row per case × allocator (or target), over all rounds. Control cases should
stay flat: no foreign slots, no leakage, fact-check and BLEU-4 equal to the reference.</p>
{{ ablation_table }}
</section>{% endif %}
{% if trend %}<section id="trend"><h2>Trend over runs</h2>
<figure class="plot">{{ trend }}</figure>{{ history_table }}</section>{% endif %}
<footer><p class="note">The guarded allocator's SequenceGuard (generation stamps checked on
every cache hit and recycle) is kvdiag's own design; vLLM has no such guard.</p></footer>
</body></html>
"""


def write_report(run_dir: Path, out: Path | None = None, history: DataFrame | None = None,
                 summary: Summary | None = None) -> Path:
    """Write `out` (default RUN_DIR/report.html) from RUN_DIR/results.parquet and the run's
    summary: `summary` as the run finishing it holds it (kvdiag.commands.lifecycle), else
    RUN_DIR/summary.json. The isolation audit, the detection matrix and kvdiag compare have
    their own pages."""
    from kvdiag.record.rundir import load_summary

    run_dir = Path(run_dir)
    results = _results(run_dir)
    summary = summary if summary is not None else load_summary(run_dir)
    own = OWN_PAGES.get(type(summary))
    text = own(summary) if own is not None else render_report(results, summary, history)
    out = Path(out) if out is not None else run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def load_run(run_dir: Path) -> tuple[DataFrame, Summary]:
    """The run's records and typed summary; KvdiagError names a missing or bad file."""
    from kvdiag.record.rundir import load_summary

    return _results(Path(run_dir)), load_summary(run_dir)


def _results(run_dir: Path) -> DataFrame:
    import pandas as pd

    results = run_dir / "results.parquet"
    if not results.is_file():
        raise KvdiagError(f"{results}: not found (is {run_dir} a kvdiag run directory?)")
    return pd.read_parquet(results)


def render_report(results: DataFrame, summary: RunSummary, history: DataFrame | None = None) -> str:
    """The page as a string (see the module docstring)."""
    import jinja2
    from markupsafe import Markup

    from kvdiag.metrics.decay import MAIN_CASE, per_round, series_name, summarize
    from kvdiag.report import plots, tables
    from kvdiag.report.meaning import rerun_command, verdict_meaning

    df = results.copy()
    df["series"] = [series_name(t, a) for t, a in zip(df["target"], df["allocator"])]
    table = per_round(df)
    probe = summary if isinstance(summary, ProbeSummary) else None
    withheld = probe is not None and probe.text == "withheld"
    if withheld:  # texts are hashes now: BLEU-4 as it was measured
        table = _measured_bleu(table, summary)
    table["series"] = [series_name(t, a) for t, a in zip(table["target"], table["allocator"])]
    computed = summarize(df)
    by_case = {**{case: CaseMetrics.model_validate(m) for case, m in computed.by_case.items()},
               **summary.by_case}
    cases = list(dict.fromkeys(df["case"]))
    main = summary.main_case or (MAIN_CASE if MAIN_CASE in cases else cases[0])
    measured = by_case.get(main) or CaseMetrics()
    by_case[main] = CaseMetrics(sqdr=summary.sqdr or measured.sqdr, brai=summary.brai or measured.brai)
    sqdr, brai = by_case[main].sqdr, by_case[main].brai
    main_table = table[table["case"] == main]
    main_rows = df[df["case"] == main]
    heat = heatmap_grids(main_rows)
    page = jinja2.Environment(autoescape=True).from_string(_PAGE)
    return page.render(
        css=Markup(_CSS), verdict=summary.verdict.value.upper(), suite=summary.suite,
        meaning=verdict_meaning(summary), environment=environment_rows(summary.environment),
        targets=", ".join(summary.targets or dict.fromkeys(df["target"])),
        cases=", ".join(summary.cases or cases), main_case=main,
        signature=summary.signature, created=summary.created or "?",
        wall=_seconds(summary.wall_seconds),
        bleu_signature=summary.bleu_signature or computed.bleu_signature,
        command=rerun_command(summary.command) or "(not recorded in summary.json)",
        withheld=withheld, sessions_note=_sessions_note(probe.sessions_file if probe else None),
        decay_svg=Markup(plots.decay_curves(
            main_table, departure_rounds(main_table),
            f"Per-round quality · suite {summary.suite} · case {main}")),
        other_decay=[(case, Markup(plots.decay_curves(
            rows, departed, f"Per-round quality · suite {summary.suite} · case {case}",
            prefix=f"decay{i}")))
            for i, (case, rows, departed) in enumerate(_other_departures(table, cases, main), 1)],
        alert_table=Markup(tables.to_html(tables.alert_table(sqdr, brai), "alerts")),
        heat_title=heat[1].capitalize() if heat else "Leakage",
        heat_svg=Markup(plots.heatmap(heat[0], heat[1])) if heat else None,
        heat_caption=heat[2] if heat else "",
        ablation_table=Markup(tables.to_html(tables.ablation_table(df, by_case), "ablations"))
        if len(cases) > 1 else None,  # one case: nothing was ablated
        rounds_table=Markup(tables.to_html(tables.rounds_table(main_table), "rounds")),
        events_table=Markup(tables.to_html(tables.events_table(probe.events), "events"))
        if probe is not None and probe.events else None,
        trend=Markup(plots.trend(history)) if history is not None and len(history) else None,
        history_table=Markup(tables.to_html(tables.history_table(history), "history"))
        if history is not None and len(history) else "",
    )


def _measured_bleu(table: DataFrame, summary: Summary) -> DataFrame:
    """The per-round table with summary.json's BLEU-4 (computed before the text was withheld)."""
    keys = ("case", "target", "allocator", "round")
    measured = {tuple(getattr(r, k) for k in keys): r.bleu4 for r in summary.rounds}
    table = table.copy()
    table["bleu4"] = [measured.get(tuple(row[k] for k in keys), math.nan)
                      for row in table.to_dict("records")]
    return table


def _sessions_note(f: SessionsFile | None) -> str | None:
    """One line on the sessions file a probe replayed (its summary's `sessions_file`, a block
    kvdiag.userdata describes), or None."""
    if f is None:
        return None
    check = f.fact_check.pipeline if f.fact_check else None
    return (f"{f.file} ({f.format}): {f.sessions} conversations x {f.rounds} rounds, "
            f"{f.skipped_too_long} skipped as longer than the server's context; fact check: {check or '?'}")


def _other_departures(table: DataFrame, cases: list[str], main: str):
    """(case, rows, departure rounds) of every case but the main one where a series departs."""
    for case in cases:
        rows = table[table["case"] == case]
        departed = departure_rounds(rows) if case != main else {}
        if any(r is not None for r in departed.values()):
            yield case, rows, departed


def heatmap_grids(rows: DataFrame) -> tuple[dict, str, str] | None:
    """session x round grids per non-reference series: leakage, or else divergence share."""
    rows = rows[~rows["series"].isin(REFERENCE_ALLOCATORS)]
    if rows.empty:
        return None
    if rows["attention_leakage"].notna().any():
        column, measure = "attention_leakage", "attention leakage"
        caption = "Mean attention mass on foreign or unwritten slots per generated token."
    else:
        rows = rows.assign(divergence=[_divergence(r) for r in rows.to_dict("records")])
        column, measure = "divergence", "diverged share of output"
        caption = ("Leakage was not captured for this target; shown instead: the share of "
                   "each output after its first token that differs from the reference.")
    names = list(dict.fromkeys(rows["series"]))[:MAX_HEATMAPS]
    grids = {n: rows[rows["series"] == n].pivot_table(index="session", columns="round",
                                                      values=column, aggfunc="mean",
                                                      dropna=False)
             for n in names}
    return grids, measure, caption


def _divergence(record: dict) -> float:
    first = record.get("first_divergence")
    if first is None or str(first) == "<NA>" or (isinstance(first, float) and math.isnan(first)):
        return 0.0
    length = max(len(record["output_token_ids"]), len(record["reference_token_ids"]), 1)
    return 1.0 - int(first) / length


def environment_rows(environment: Environment) -> list[tuple[str, str]]:
    """summary.json's environment block (kvdiag.record.environment) as (label, text) rows; [] if none."""
    rows = [(name, str(version)) for name, version in environment.packages.items()
            if version is not None]
    rows += [(f"spaCy model {name}", str(version or "not installed"))
             for name, version in environment.spacy_models.items()]
    for label, value in (("python", environment.python), ("platform", environment.platform),
                         ("cpu", environment.cpu), ("cpu count", environment.cpu_count)):
        if value not in (None, ""):
            rows.append((label, str(value)))
    git = environment.git
    if git is not None and git.commit:
        rows.append(("git commit", git.commit + (" (uncommitted changes)" if git.dirty else "")))
    return rows


def _seconds(value) -> str:
    return "?" if value is None else f"{float(value):.1f} s"
