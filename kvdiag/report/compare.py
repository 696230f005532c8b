"""kvdiag compare's one self-contained page (no scripts, nothing loaded from anywhere): the
overall verdict, one row per target (its own verdict, the sentence why, a link to its own
run's report), and the targets' decay curves drawn together: per-round BLEU-4 and fact-check
pass rate of each target's shared series against its own isolated twin, one line per target.

Reads only summary.json (kvdiag.record.summary.CompareSummary), like the matrix and isolation pages.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvdiag.report.style import CSS, template

if TYPE_CHECKING:
    from kvdiag.record.summary import CompareSummary

PANELS = (("bleu4", "BLEU-4", (-3, 103)),  # column, label, y limits: kvdiag.report.plots.PANELS
          ("fact_check_pass_rate", "fact-check pass rate", (-0.03, 1.03)))


def decay_svg(summary: CompareSummary) -> str:
    """Two panels (BLEU-4, fact check) of every target's shared series, drawn as
    kvdiag.report.plots draws a run's decay curves (colours, markers, hover titles); a dotted
    line marks a target's first corrupted round."""
    from kvdiag.report.plots import RC, colours, hover_targets, pyplot, svg

    plt = pyplot()
    names = [t.target for t in summary.targets]
    style = colours(names)
    first = {t.target: t.first_corruption_round for t in summary.targets}
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
        for ax, (column, label, ylim) in zip(axes, PANELS):
            for name in names:
                rows = sorted((r for r in summary.rounds if r.target == name), key=lambda r: r.round)
                x = [r.round for r in rows]
                y = [math.nan if getattr(r, column) is None else getattr(r, column) for r in rows]
                colour, marker = style[name]
                ax.plot(x, y, color=colour, marker=marker, markersize=4, linewidth=1.8, label=name)
                hover_targets(ax, x, y, hover,
                              lambda a, b, n=name, lab=label: f"{n} · round {a:g} · {lab}: {b:.4g}")
                if first.get(name) is not None:
                    ax.axvline(first[name], color=colour, linestyle=":", linewidth=1.2)
            if all(getattr(r, column) is None for r in summary.rounds):
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


# jinja2, autoescaped (as kvdiag.report.html); adjacent literals keep the markup as it was
_PAGE = (
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
    '<title>{{ verdict|upper }} · kvdiag compare</title><style>{{ css }}</style></head><body>'
    '<header class="verdict-{{ verdict }}"><h1 id="verdict"><span class="badge">'
    '{{ verdict|upper }}</span>kvdiag · compare</h1><p class="meaning" id="verdict-meaning">'
    '{{ reason }}</p><dl class="meta">'
    '{% for key, value in meta %}<dt>{{ key }}</dt><dd>{{ value }}</dd>{% endfor %}</dl>'
    '<p>Rerun with:</p><pre><code>{{ command }}</code></pre>'
    '</header><section id="targets"><h2>Verdict per target</h2><p class="note">Every '
    'target is judged by its own probe: its shared answers against its own cache-isolated '
    'twins and its own noise floor, never against another target\'s numerics (two engine '
    'versions may differ in their last digits and both be healthy). The overall verdict is '
    'the worst of theirs.</p>'
    '<table class="data" id="T_targets"><tr><th>target</th><th>verdict</th><th>why</th>'
    '<th>SQDR</th><th>first corrupted round</th></tr>'
    '{% for name, word, run_dir, why, sqdr, first in targets %}<tr><td>{{ name }}</td>'
    '<td class="{{ word }}"><b>{{ word|upper }}</b>'
    '{% if run_dir %} <a href="{{ run_dir }}/report.html">report</a>{% endif %}</td>'
    '<td style="text-align:left;white-space:normal">{{ why }}</td><td>{{ sqdr }}</td>'
    '<td>{{ first }}</td></tr>{% endfor %}</table></section>'
    '<section id="decay"><h2>Decay per round</h2>'
    '{% if svg %}<figure class="plot">{{ svg }}<figcaption>Each line is one target\'s '
    'shared series, scored against that target\'s own isolated runs (BLEU-4 of the '
    'shared answers against the isolated ones; the share of rounds whose isolated '
    'answer\'s entities survive unchanged). A dotted line marks a target\'s first '
    'corrupted round. Hover over a point for its value.</figcaption></figure>'
    '{% else %}<p class="note">No target was measured: nothing to draw.</p>{% endif %}'
    '<details><summary>Per-round values</summary>'
    '<table class="data" id="T_rounds"><tr><th>target</th><th>round</th><th>BLEU-4</th>'
    '<th>fact-check pass rate</th><th>diverged sessions</th></tr>'
    '{% for row in rounds %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>'
    '{% endfor %}</table></details></section></body></html>\n')



def page(summary: CompareSummary) -> str:
    from markupsafe import Markup

    targets = [(t.target, t.verdict.value, t.run_dir, t.reason, _number(t.sqdr, ".4f"),
                t.first_corruption_round or "-") for t in summary.targets]
    rounds = [(r.target, r.round, _number(r.bleu4, ".2f"), _number(r.fact_check_pass_rate, ".3f"),
               r.diverged_sessions) for r in summary.rounds]
    meta = [("suite", summary.suite), ("sessions_file", summary.sessions_file),
            ("signature", summary.signature), ("bleu_signature", summary.bleu_signature),
            ("created", summary.created), ("wall_seconds", summary.wall_seconds)]
    return template(_PAGE).render(
        css=Markup(CSS), verdict=summary.verdict.value, reason=summary.reason,
        command=summary.command or "", meta=[(k, v or "-") for k, v in meta],
        targets=targets, rounds=rounds, svg=Markup(decay_svg(summary)) if summary.rounds else None)
