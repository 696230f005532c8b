"""Matplotlib figures of a run, returned as inline SVG markup (Agg backend, no files).

Every function takes already-aggregated data (see `kvdiag.metrics.decay.per_round`) and
returns a string holding one `<svg>` element whose ids are prefixed, so several can share a
page. Colours are the Okabe-Ito set (distinguishable with colour-blindness), each series
also gets its own marker; the contiguous reference is black, dashed, on a grey band.
Every point of a curve carries an SVG `<title>` (series, round, value) that browsers show
on hover, without any script. The reference has no cache: it is left out of the reuse panel.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kvdiag.vocab import CONTIGUOUS

if TYPE_CHECKING:
    from pandas import DataFrame

REFERENCES = (CONTIGUOUS, "isolated")  # the ground truth of reference runs and of live probes
NO_CACHE_PANELS = ("block_reuse_rate",)  # meaningless for a reference (it has no cache)
PALETTE = ("#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#7F3C8D", "#8C6D31")
BASELINE_COLOUR = "#0072B2"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<")
PANELS = (  # column, y label, y limits (None: from data)
    ("fact_check_pass_rate", "fact-check pass rate", (-0.03, 1.03)),
    ("bleu4", "BLEU-4", (-3, 103)),
    ("attention_leakage", "attention leakage (mean)", None),
    ("block_reuse_rate", "block reuse rate", (-0.03, 1.03)),
)
RC = {"svg.fonttype": "none", "svg.hashsalt": "kvdiag", "font.size": 9,
       "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
       "grid.alpha": 0.3, "font.family": ["DejaVu Sans", "sans-serif"]}


def colours(names: Iterable[str], baseline: str = "guarded") -> dict[str, tuple[str, str]]:
    """name -> (colour, marker); stable for a given list of names."""
    out, k = {}, 0
    for name in dict.fromkeys(names):
        if name in REFERENCES:
            out[name] = ("#000000", "")
        elif name == baseline:
            out[name] = (BASELINE_COLOUR, "o")
        else:
            out[name] = (PALETTE[k % len(PALETTE)], MARKERS[(k + 1) % len(MARKERS)])
            k += 1
    return out


def decay_curves(table: DataFrame, departures: Mapping[str, int | None], title: str,
                 prefix: str = "decay") -> str:
    """2 x 2 panels of per-round metrics, one line per `series`; departures marked.

    `table`: per-round rows of one case with a `series` column; `departures`: series ->
    first round whose output departs from the reference (None: never).
    """
    plt = pyplot()
    names = list(dict.fromkeys(table["series"]))
    style = colours(names)
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharex=True)
        for ax, (column, label, ylim) in zip(axes.flat, PANELS):
            for name in names:
                if name in REFERENCES and column in NO_CACHE_PANELS:
                    continue
                rows = table[table["series"] == name].sort_values("round")
                _line(ax, rows["round"], rows[column], name, style[name])
                hover_targets(ax, rows["round"], rows[column], hover,
                       lambda x, y, n=name, lab=label: f"{n} · round {x:g} · {lab}: {y:.4g}")
                r = departures.get(name)
                if r is not None and name not in REFERENCES:
                    y = rows.loc[rows["round"] == r, column]
                    ax.axvline(r, color=style[name][0], linestyle=":", linewidth=1.2)
                    if len(y) and not math.isnan(float(y.iloc[0])):
                        ax.plot([r], [float(y.iloc[0])], marker="o", markersize=13,
                                markerfacecolor="none", markeredgecolor=style[name][0],
                                markeredgewidth=2, linestyle="none")
            shown = table[~table["series"].isin(REFERENCES)] if column in NO_CACHE_PANELS else table
            if shown[column].isna().all():
                ax.text(0.5, 0.5, "not measured here", transform=ax.transAxes,
                        ha="center", va="center", color="#555555")
            ax.set_ylabel(label)
            ax.set_title(label, loc="left", fontsize=10, fontweight="bold")
            if ylim:
                ax.set_ylim(*ylim)
            else:
                ax.set_ylim(bottom=-0.002)
        for ax in axes[1]:
            ax.set_xlabel("round")
            ax.xaxis.get_major_locator().set_params(integer=True)
        handles = [_handle(plt, name, style[name], departures.get(name)) for name in names]
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)),
                   frameon=False, fontsize=9)
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
        fig.tight_layout(rect=(0, 0.04 + 0.035 * math.ceil(len(handles) / 4), 1, 0.96))
        return svg(fig, prefix, hover)


def heatmap(grids: Mapping[str, DataFrame], measure: str) -> str:
    """Session x round grids side by side (one per series), on one colour scale from 0.

    `grids`: series -> DataFrame indexed by session, columns rounds; `measure` labels the
    colour bar ("attention leakage" or "diverged share of output tokens").
    """
    plt = pyplot()
    values = [v for g in grids.values() for v in g.to_numpy(dtype=float).ravel() if v == v]
    top = max([*values, 1e-9])  # v == v drops NaN
    with plt.rc_context({**RC, "axes.grid": False}):
        n = len(grids)
        rows = max(len(g) for g in grids.values())
        fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 14) + 1, 1.2 + 0.22 * rows),
                                 squeeze=False)
        image = None
        for ax, (name, grid) in zip(axes[0], grids.items()):
            image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="magma_r",
                              vmin=0, vmax=top, interpolation="nearest")
            ax.set_title(name, fontsize=10, fontweight="bold")
            ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns])
            ax.set_yticks(range(len(grid.index)), [str(s) for s in grid.index], fontsize=7)
            ax.set_xlabel("round")
            ax.set_ylabel("session")
        fig.colorbar(image, ax=list(axes[0]), label=measure, shrink=0.9)
        return svg(fig, "heat")


def trend(history: DataFrame) -> str:
    """SQDR and BRAI of past runs, one line per target, with their alert thresholds."""
    from kvdiag.metrics.decay import SQDR_ALERT, SQDR_HEALTHY
    from kvdiag.vocab import BRAI_MAX

    plt = pyplot()
    history = history.sort_values("created")
    key = "run_id" if "run_id" in history.columns else "created"
    runs = list(dict.fromkeys(history[key]))  # x: one position per run, oldest first
    created = dict(zip(history[key], history["created"]))
    history = history.assign(x=[runs.index(r) for r in history[key]])
    names = list(dict.fromkeys(history["target"]))
    style = colours(names)
    hover: dict[str, list[str]] = {}
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
        for ax, column, lines in ((axes[0], "sqdr", ((SQDR_HEALTHY, "healthy", "#009E73"),
                                                     (SQDR_ALERT, "alert", "#D55E00"))),
                                  (axes[1], "brai", ((BRAI_MAX, "alert", "#D55E00"),))):
            for name in names:
                rows = history[history["target"] == name]
                _line(ax, rows["x"], rows[column], name, style[name])
                hover_targets(ax, rows["x"], rows[column], hover,
                       lambda x, y, n=name, c=column: f"{n} · {created[runs[int(x)]]} · "
                                                      f"{c.upper()}: {y:.4g}")
                failed = rows[rows["verdict"].astype(str).str.lower() == "fail"]
                ax.plot(failed["x"], failed[column], "x", color="#D55E00", markersize=9,
                        markeredgewidth=2, label="_failed")
            for y, word, colour in lines:
                ax.axhline(y, color=colour, linestyle="--", linewidth=1)
                ax.annotate(f"{word} {y:g}", (1, y), xycoords=("axes fraction", "data"),
                            ha="right", va="bottom", color=colour, fontsize=8)
            ax.set_xticks(range(len(runs)), [str(created[r])[:10] for r in runs],
                          rotation=30, ha="right", fontsize=7)
            ax.set_xlabel("run (created)")
            ax.set_ylabel(column.upper())
            ax.set_title(f"{column.upper()} over runs (x: failed run)", loc="left", fontsize=10)
        axes[0].legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return svg(fig, "trend", hover)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(ax, x, y, name: str, style: tuple[str, str]) -> None:
    colour, marker = style
    if name in REFERENCES:
        ax.plot(x, y, color="#9a9a9a", linewidth=6, alpha=0.45, solid_capstyle="round", zorder=1)
        ax.plot(x, y, color=colour, linestyle="--", linewidth=1.4, label=name, zorder=3)
    else:
        ax.plot(x, y, color=colour, marker=marker, markersize=4, linewidth=1.8, label=name,
                zorder=2)


def hover_targets(ax, x, y, hover: dict[str, list[str]], title) -> None:
    """Invisible hit targets on every finite point, one `<title>` each (added by _svg)."""
    gid = f"hover-{len(hover)}"
    points = [(float(a), float(b)) for a, b in zip(x, y) if b is not None and not math.isnan(float(b))]
    hover[gid] = [title(a, b) for a, b in points]
    ax.plot([a for a, _ in points], [b for _, b in points], linestyle="none", marker="o",
            markersize=9, alpha=0, gid=gid, label="_hover", zorder=6)


def _titled(text: str, hover: Mapping[str, list[str]]) -> str:
    """Give each marker (<use>) of the hover groups its <title>, in plotting order.

    Matplotlib writes one <use> per finite point inside the group's clip <g>; a group whose
    count differs (never seen) keeps no titles rather than wrong ones.
    """
    from xml.sax.saxutils import escape

    for gid, titles in hover.items():
        start = text.find(f'<g id="{gid}">')
        if start < 0:
            continue
        end = text.find("</g>", text.find("<use", start))
        uses = list(re.finditer(r"<use ([^>]*?)/>", text[start:end]))
        if len(uses) != len(titles):
            continue
        body = text[start:end]
        for match, title in reversed(list(zip(uses, titles))):
            body = (body[:match.start()] + f"<use {match.group(1)}><title>{escape(title)}"
                    f"</title></use>" + body[match.end():])
        text = text[:start] + body + text[end:]
    return text


def _handle(plt, name: str, style: tuple[str, str], departs: int | None):
    from matplotlib.lines import Line2D

    colour, marker = style
    if name in REFERENCES:
        label = ("contiguous reference (ground truth)" if name == CONTIGUOUS
                 else "isolated runs, fresh cache_salt (ground truth)")
        return Line2D([], [], color=colour, linestyle="--", linewidth=1.4, label=label)
    note = f"departs at round {departs}" if departs is not None else "matches reference"
    return Line2D([], [], color=colour, marker=marker, linewidth=1.8, label=f"{name}: {note}")


def svg(fig, prefix: str, hover: Mapping[str, list[str]] | None = None) -> str:
    """The figure as one <svg> element, ids prefixed to stay unique on a shared page, hover
    titles added (see _titled)."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    text = _titled(text[text.index("<svg"):], hover or {})
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', text)
    return text.replace("<svg ", '<svg class="plot-svg" ', 1)
