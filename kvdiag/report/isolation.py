"""The isolation audit's HTML: per configuration, a matplotlib plot (inline SVG) of the timing
AUC and the share of the prefix served from cache against prefix length, and a table of
every cell.

`fragment(summary)` returns a <section> to embed in a run page; `page(summary)` wraps it in
a self-contained page (the same inline style as kvdiag.report.html, no scripts, nothing
loaded from anywhere). Both read only the IsolationSummary (its `isolation` block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvdiag.report.style import CSS as _CSS
from kvdiag.report.style import template

if TYPE_CHECKING:
    from kvdiag.record.isolation_rows import IsolationCell
    from kvdiag.record.summary import IsolationSummary

TITLES = {
    "no-salt": "No salt: shared cache (the exposure of an unsalted deployment; not judged)",
    "per-tenant": "Per-tenant salts (judged)",
    "same-salt": "Same salt for both tenants (positive control: must hit)",
    "adapter": "Salt equal to another tenant's adapter name (judged; vLLM #44701)",
}
HEAD = ("prefix tokens", "trials", "cached: correct", "cached: wrong", "TTFT correct (median)",
        "TTFT wrong (median)", "AUC", "AUC 95 % CI", "p", "told apart by")

# jinja2, autoescaped (as kvdiag.report.html); adjacent literals keep the markup as it was
_FRAGMENT = (
    '<section id="isolation"><h2>Tenant isolation</h2>\n'
    '<p class="note">{{ reason }}</p>\n'
    '<p class="note">AUC: the probability that a correct guess of the victim\'s prefix '
    'gets its first token sooner than a wrong guess of the same length (0.5: timing '
    'tells nothing; 1: every guess told apart). Dashed: 0.5. Cached share: cached tokens '
    'of correct guesses / prefix length (mean).</p>\n'
    '{% for title, config, svg, rows in sections %}<h3>{{ title }}</h3>\n'
    '<figure class="plot">{{ svg }}<figcaption>{{ config }}: '
    'AUC (circles) and cached share (squares) per prefix length; a filled '
    'red ring marks a leaking cell.</figcaption></figure>\n'
    '<table class="data"><tr>{% for h in head %}<th>{{ h }}</th>{% endfor %}</tr>'
    '{% for cells, told, bad in rows %}<tr>{% for cell in cells %}<td>{{ cell }}</td>{% endfor %}'
    '<td class="{{ "fail" if bad else "pass" }}">{{ told }}</td></tr>{% endfor %}</table>\n'
    '{% endfor %}</section>')
_PAGE = (
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
    '<title>{{ verdict|upper }} · kvdiag isolation</title><style>{{ css }}</style></head>'
    '<body><header class="verdict-{{ verdict }}"><h1><span class="badge">'
    '{{ verdict|upper }}</span>kvdiag · tenant isolation</h1><dl class="meta">'
    '{% for key, value in meta %}<dt>{{ key }}</dt><dd>{{ value }}</dd>{% endfor %}'
    '</dl><p>Rerun with:</p><pre><code>{{ command }}</code></pre>'
    '</header>{{ fragment }}</body></html>\n')



def fragment(summary: IsolationSummary) -> str:
    from markupsafe import Markup

    cells = summary.isolation.cells
    sections = []
    for config in dict.fromkeys(c.config for c in cells):
        rows = sorted((c for c in cells if c.config == config), key=lambda c: c.length)
        sections.append((TITLES.get(config, config), config, Markup(plot(rows, config)),
                         [_row(r) for r in rows]))
    return template(_FRAGMENT).render(reason=summary.reason, head=HEAD, sections=sections)


def page(summary: IsolationSummary) -> str:
    from markupsafe import Markup

    meta = [("target", summary.target), ("model", summary.model), ("signature", summary.signature),
            ("created", summary.created or "?"), ("wall_seconds", summary.wall_seconds),
            ("requests", summary.requests)]
    return template(_PAGE).render(
        css=Markup(_CSS), verdict=summary.verdict.value, meta=meta,
        command=summary.command or "", fragment=Markup(fragment(summary)))


def plot(rows: list[IsolationCell], prefix: str) -> str:
    """AUC and cached share (y in [0, 1]) against prefix length (log2 axis), drawn by
    matplotlib like every other plot of a run (kvdiag.report.plots), hover titles included."""
    from kvdiag.report.plots import RC, hover_targets, pyplot, svg

    plt = pyplot()
    lengths = [r.length for r in rows]
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(4.8, 2.6))
        ax.axhline(0.5, color="#9a9a9a", linestyle="--", linewidth=1)
        for key, colour, marker, label in (("auc", "#0072B2", "o", "AUC (correct vs wrong TTFT)"),
                                            ("cached_share", "#D55E00", "s", "cached share of the prefix")):
            ys = [_value(r, key) for r in rows]
            ax.plot(lengths, ys, color=colour, marker=marker, markersize=5, linewidth=1.5, label=label)
            hover_targets(ax, lengths, ys, hover, lambda x, y, k=key: f"{prefix} · {int(x)} tokens · {k}: {y:.3g}")
        leaks = [(r.length, _value(r, "auc")) for r in rows if r.leaks]
        if leaks:
            ax.plot(*zip(*leaks), linestyle="none", marker="o", markersize=13, markerfacecolor="none",
                    markeredgecolor="#c0392b", markeredgewidth=2, label="leaking cell")
        if lengths:
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("prefix length (tokens)")
        ax.legend(frameon=False, fontsize=7, loc="lower right")
        fig.tight_layout()
        return svg(fig, f"iso-{prefix}", hover)


def _value(row: IsolationCell, key: str) -> float:
    if key == "cached_share":
        return min(1.0, max(0.0, row.cached_correct_mean / row.length)) if row.length else 0.0
    return float(getattr(row, key))


def _ci(row: IsolationCell) -> str:
    ci = row.auc_ci95
    return f"{ci[0]:.2f} to {ci[1]:.2f}" if len(ci) == 2 else "?"


def _row(r: IsolationCell) -> tuple[list, str, bool]:
    """One table row: (its cells as text, what told the guesses apart, whether that is bad)."""
    told = [k for k, flag in (("content", r.content_leak), ("timing", r.timing_leak)) if flag]
    # told apart is the point of the control, and a failure anywhere else
    bad = bool(told) != (r.config == "same-salt")
    cells = [r.length, r.trials, f"{r.cached_correct_mean:.0f}", f"{r.cached_wrong_mean:.0f}",
             f"{r.ttft_correct_median_s * 1000:.1f} ms", f"{r.ttft_wrong_median_s * 1000:.1f} ms",
             f"{r.auc:.2f}", _ci(r), f"{r.p_value:.2g}"]
    return cells, " + ".join(told) or "nothing", bad
