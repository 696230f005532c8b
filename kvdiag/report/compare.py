"""kvdiag compare's one self-contained page (no scripts, nothing loaded from anywhere): the
overall verdict, one row per target (its own verdict, the sentence why, a link to its own
run's report), and the targets' decay curves drawn together: per-round BLEU-4 and fact-check
pass rate of each target's shared series against its own isolated twin, one line per target.

Reads only summary.json (kvdiag.summary.CompareSummary), like the matrix and isolation pages.
"""

from __future__ import annotations

import math
from html import escape

from kvdiag.report.style import CSS
from kvdiag.verdicts import Verdict

PANELS = (("bleu4", "BLEU-4", (-3, 103)),  # column, label, y limits: kvdiag.report.plots.PANELS
          ("fact_check_pass_rate", "fact-check pass rate", (-0.03, 1.03)))


def decay_svg(summary: dict) -> str:
    """Two panels (BLEU-4, fact check) of every target's shared series, drawn as
    kvdiag.report.plots draws a run's decay curves (colours, markers, hover titles); a dotted
    line marks a target's first corrupted round."""
    from kvdiag.report.plots import RC, colours, hover_targets, pyplot, svg

    plt = pyplot()
    names = [t["target"] for t in summary.get("targets", [])]
    style = colours(names)
    first = {t["target"]: t.get("first_corruption_round") for t in summary.get("targets", [])}
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
        for ax, (column, label, ylim) in zip(axes, PANELS):
            for name in names:
                rows = sorted((r for r in summary.get("rounds", []) if r["target"] == name),
                              key=lambda r: r["round"])
                x = [r["round"] for r in rows]
                y = [math.nan if r.get(column) is None else r[column] for r in rows]
                colour, marker = style[name]
                ax.plot(x, y, color=colour, marker=marker, markersize=4, linewidth=1.8, label=name)
                hover_targets(ax, x, y, hover,
                              lambda a, b, n=name, lab=label: f"{n} · round {a:g} · {lab}: {b:.4g}")
                if first.get(name) is not None:
                    ax.axvline(first[name], color=colour, linestyle=":", linewidth=1.2)
            if all(r.get(column) is None for r in summary.get("rounds", [])):
                ax.text(0.5, 0.5, "not measured (no entity to check)" if column != "bleu4" else
                        "not measured", transform=ax.transAxes, ha="center", va="center",
                        color="#555555")
            ax.set_title(label, loc="left", fontsize=10, fontweight="bold")
            ax.set_ylabel(label)
            ax.set_xlabel("round")
            ax.set_ylim(*ylim)
            ax.xaxis.get_major_locator().set_params(integer=True)
        axes[0].legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return svg(fig, "compare", hover)


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _targets_table(summary: dict) -> str:
    rows = []
    for t in summary.get("targets", []):
        word = Verdict.parse(t.get("verdict")).value
        link = (f' <a href="{escape(t["run_dir"])}/report.html">report</a>' if t.get("run_dir") else "")
        rows.append(f'<tr><td>{escape(t["target"])}</td><td class="{word}"><b>{word.upper()}</b>'
                    f'{link}</td><td style="text-align:left;white-space:normal">'
                    f'{escape(str(t.get("reason", "")))}</td><td>{_number(t.get("sqdr"), ".4f")}</td>'
                    f'<td>{escape(str(t.get("first_corruption_round") or "-"))}</td></tr>')
    return ('<table class="data" id="T_targets"><tr><th>target</th><th>verdict</th><th>why</th>'
            f'<th>SQDR</th><th>first corrupted round</th></tr>{"".join(rows)}</table>')


def _rounds_table(summary: dict) -> str:
    rows = "".join(f'<tr><td>{escape(r["target"])}</td><td>{r["round"]}</td>'
                   f'<td>{_number(r.get("bleu4"), ".2f")}</td>'
                   f'<td>{_number(r.get("fact_check_pass_rate"), ".3f")}</td>'
                   f'<td>{r.get("diverged_sessions", 0)}</td></tr>'
                   for r in summary.get("rounds", []))
    return ('<table class="data" id="T_rounds"><tr><th>target</th><th>round</th><th>BLEU-4</th>'
            f'<th>fact-check pass rate</th><th>diverged sessions</th></tr>{rows}</table>')


def page(summary: dict) -> str:
    verdict = Verdict.parse(summary.get("verdict")).value
    measured = any(r for r in summary.get("rounds", []))
    meta = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(summary.get(k) or '-'))}</dd>"
                   for k in ("suite", "sessions_file", "signature", "bleu_signature", "created",
                             "wall_seconds"))
    figure = (f'<figure class="plot">{decay_svg(summary)}<figcaption>Each line is one target\'s '
              'shared series, scored against that target\'s own isolated runs (BLEU-4 of the '
              'shared answers against the isolated ones; the share of rounds whose isolated '
              'answer\'s entities survive unchanged). A dotted line marks a target\'s first '
              'corrupted round. Hover over a point for its value.</figcaption></figure>'
              if measured else '<p class="note">No target was measured: nothing to draw.</p>')
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{verdict.upper()} · kvdiag compare</title><style>{CSS}</style></head><body>'
            f'<header class="verdict-{verdict}"><h1 id="verdict"><span class="badge">'
            f'{verdict.upper()}</span>kvdiag · compare</h1><p class="meaning" id="verdict-meaning">'
            f'{escape(str(summary.get("reason", "")))}</p><dl class="meta">{meta}</dl>'
            f'<p>Rerun with:</p><pre><code>{escape(str(summary.get("command") or ""))}</code></pre>'
            '</header><section id="targets"><h2>Verdict per target</h2><p class="note">Every '
            'target is judged by its own probe: its shared answers against its own cache-isolated '
            'twins and its own noise floor, never against another target\'s numerics (two engine '
            'versions may differ in their last digits and both be healthy). The overall verdict is '
            f'the worst of theirs.</p>{_targets_table(summary)}</section>'
            f'<section id="decay"><h2>Decay per round</h2>{figure}<details><summary>Per-round '
            f'values</summary>{_rounds_table(summary)}</details></section></body></html>\n')
