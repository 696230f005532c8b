"""The isolation audit's HTML: per configuration, an inline-SVG plot of the timing AUC and the
share of the prefix served from cache against prefix length, and a table of every cell.

`fragment(summary)` returns a <section> to embed in a run page; `page(summary)` wraps it in
a self-contained page (the same inline style as kvdiag.report.html, no scripts, nothing
loaded from anywhere). Both read only summary.json's `isolation` block.
"""

from __future__ import annotations

import math
from html import escape

from kvdiag.report.style import CSS as _CSS

TITLES = {
    "no-salt": "No salt: shared cache (the exposure of an unsalted deployment; not judged)",
    "per-tenant": "Per-tenant salts (judged)",
    "same-salt": "Same salt for both tenants (positive control: must hit)",
    "adapter": "Salt equal to another tenant's adapter name (judged; vLLM #44701)",
}
W, H, L, R, T, B = 460, 250, 52, 16, 34, 40  # plot size and margins, px (legend in the top one)


def fragment(summary: dict) -> str:
    iso = summary.get("isolation") or {}
    cells = iso.get("cells") or []
    parts = ['<section id="isolation"><h2>Tenant isolation</h2>',
             f'<p class="note">{escape(str(summary.get("reason", "")))}</p>',
             '<p class="note">AUC: the probability that a correct guess of the victim\'s prefix '
             'gets its first token sooner than a wrong guess of the same length (0.5: timing '
             'tells nothing; 1: every guess told apart). Dashed: 0.5. Cached share: cached tokens '
             'of correct guesses / prefix length (mean).</p>']
    for config in dict.fromkeys(c["config"] for c in cells):
        rows = sorted((c for c in cells if c["config"] == config), key=lambda c: c["length"])
        parts.append(f'<h3>{escape(TITLES.get(config, config))}</h3>')
        parts.append(f'<figure class="plot">{plot(rows, config)}<figcaption>{escape(config)}: '
                     'AUC (circles) and cached share (squares) per prefix length; a filled '
                     'red ring marks a leaking cell.</figcaption></figure>')
        parts.append(_table(rows))
    parts.append("</section>")
    return "\n".join(parts)


def page(summary: dict) -> str:
    verdict = str(summary.get("verdict", "unknown"))
    css_class = verdict if verdict in ("pass", "fail", "inconclusive", "error") else "error"
    meta = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(summary.get(k, '?')))}</dd>"
                   for k in ("target", "model", "signature", "created", "wall_seconds", "requests"))
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{escape(verdict.upper())} · kvdiag isolation</title><style>{_CSS}</style></head>'
            f'<body><header class="verdict-{css_class}"><h1><span class="badge">'
            f'{escape(verdict.upper())}</span>kvdiag · tenant isolation</h1><dl class="meta">{meta}'
            f'</dl><p>Rerun with:</p><pre><code>{escape(str(summary.get("command", "")))}</code></pre>'
            f'</header>{fragment(summary)}</body></html>\n')


def plot(rows: list[dict], prefix: str) -> str:
    """An SVG of AUC and cached share (y in [0, 1]) against log2(prefix length)."""
    xs = [math.log2(r["length"]) for r in rows]
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = hi - lo or 1.0

    def px(x: float) -> float:
        return L + (x - lo) / span * (W - L - R) if hi > lo else (L + W - R) / 2

    def py(y: float) -> float:
        return T + (1 - y) * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="AUC per prefix length, {escape(prefix)}" font-size="11" '
           'font-family="DejaVu Sans, sans-serif">']
    for y in (0, 0.25, 0.5, 0.75, 1.0):
        dash = ' stroke-dasharray="4 3"' if y == 0.5 else ""
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
                   f'stroke="#bbb"{dash}/><text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    for r, x in zip(rows, xs):
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{r["length"]}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 6}" text-anchor="middle">prefix length (tokens)</text>')
    for key, colour, shape in (("auc", "#0072B2", "circle"), ("cached_share", "#D55E00", "rect")):
        pts = [(px(x), py(_value(r, key))) for r, x in zip(rows, xs)]
        if len(pts) > 1:
            out.append('<polyline fill="none" stroke-width="1.5" stroke="{}" points="{}"/>'.format(
                colour, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        for (a, b), r in zip(pts, rows):
            if shape == "circle":
                out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{colour}"/>')
            else:
                out.append(f'<rect x="{a - 3.5:.1f}" y="{b - 3.5:.1f}" width="7" height="7" fill="{colour}"/>')
            if key == "auc" and r.get("leaks"):
                out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="8" fill="none" stroke="#c0392b" stroke-width="2"/>')
    out.append(f'<text x="{L}" y="14" fill="#0072B2">● AUC (correct vs wrong TTFT)</text>'
               f'<text x="{L + 220}" y="14" fill="#D55E00">■ cached share of the prefix</text>')
    out.append("</svg>")
    return "".join(out)


def _value(row: dict, key: str) -> float:
    if key == "cached_share":
        return min(1.0, max(0.0, row["cached_correct_mean"] / row["length"]))
    return float(row[key])


def _ci(row: dict) -> str:
    ci = row.get("auc_ci95")
    return f"{ci[0]:.2f} to {ci[1]:.2f}" if ci else "?"


def _table(rows: list[dict]) -> str:
    head = ("prefix tokens", "trials", "cached: correct", "cached: wrong", "TTFT correct (median)",
            "TTFT wrong (median)", "AUC", "AUC 95 % CI", "p", "told apart by")
    body = []
    for r in rows:
        told = [k for k in ("content", "timing") if r.get(f"{k}_leak")]
        verdict = " + ".join(told) or "nothing"
        # told apart is the point of the control, and a failure anywhere else
        bad = bool(told) != (r["config"] == "same-salt")
        body.append(
            f'<tr><td>{r["length"]}</td><td>{r["trials"]}</td><td>{r["cached_correct_mean"]:.0f}</td>'
            f'<td>{r["cached_wrong_mean"]:.0f}</td><td>{r["ttft_correct_median_s"] * 1000:.1f} ms</td>'
            f'<td>{r["ttft_wrong_median_s"] * 1000:.1f} ms</td><td>{r["auc"]:.2f}</td><td>{_ci(r)}</td>'
            f'<td>{r["p_value"]:.2g}</td><td class="{"fail" if bad else "pass"}">{verdict}</td></tr>')
    return ('<table class="data"><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join(body) + "</table>")
