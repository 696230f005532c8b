"""`kvdiag watch report`: a watch file as one self-contained HTML page in the report style:
the verdict of what was watched, every window's figures, each namespace's, and the findings
(request ids and counts; no text was ever written)."""

from __future__ import annotations

from kvdiag.report.style import CSS, template
from kvdiag.verdicts.core import Judgement
from kvdiag.verdicts.watch import judge_watch
from kvdiag.watch.log import WatchFile


def judge_file(watch: WatchFile) -> Judgement:
    return judge_watch(watch.counted("over_hit"), watch.counted("departure"),
                       watch.total("reached"), watch.total("judged"))


def _rate(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _interval(w: dict, name: str) -> str:
    lo, hi = w.get(f"{name}_low"), w.get(f"{name}_high")
    return f"{_rate(w.get(name))} [{_rate(lo)}, {_rate(hi)}]" if w.get(name) is not None else "-"


COLUMNS = ("requests", "judged", "over_hits", "warmups", "unjudged", "unreported", "twins",
           "reached", "departures", "numerics", "contaminated")


def render(watch: WatchFile) -> str:
    judged = judge_file(watch)
    windows = [{"span": f"{w['start']:.0f}–{w['end']:.0f}", "cells": [w["all"].get(c, 0) for c in COLUMNS],
                "divergence": _interval(w["all"], "divergence_rate"),
                "sqdr": _interval(w["all"], "sqdr"), "hit": _rate(w["all"].get("hit_rate"))}
               for w in watch.windows]
    spaces: dict[str, list[int]] = {}
    for w in watch.windows:
        for name, t in w["namespaces"].items():
            row = spaces.setdefault(name, [0] * len(COLUMNS))
            for i, c in enumerate(COLUMNS):
                row[i] += int(t.get(c) or 0)
    return template(_PAGE).render(
        css=CSS, verdict=judged.verdict.value, reason=judged.reason, path=watch.path,
        starts=watch.starts, columns=COLUMNS, windows=windows, spaces=sorted(spaces.items()),
        findings=watch.findings)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>kvdiag watch · {{ verdict }}</title><style>{{ css }}</style></head>
<body><header class="verdict-{{ verdict }}"><h1>kvdiag watch</h1>
<p class="meaning"><span class="badge">{{ verdict|upper }}</span>{{ reason }}</p></header>
<dl class="meta"><dt>file</dt><dd><code>{{ path }}</code></dd>
{% for s in starts %}<dt>proxy start</dt><dd>{{ s.upstream }}: sample {{ s.sample }},
 budget {{ s.budget }}/s, window {{ s.window }} s, warm-up {{ s.warmup }} s and
 {{ s.pool_tokens }} computed tokens, isolation {{ s.isolation }}</dd>{% endfor %}</dl>
<p class="note">Over-hits are sound only if every request to the upstream went through this
proxy. Twins are the client's prompt re-sent in its own namespace (shared) and in a fresh one
(isolated); only pairs whose shared replay hit the cache are judged. docs/watch.md says which
faults such traffic can show.</p>
<h2>Windows</h2>
<table class="data"><tr><th>window (unix s)</th>{% for c in columns %}<th>{{ c }}</th>{% endfor %}
<th>divergence rate [95 %]</th><th>SQDR [95 %]</th><th>hit rate</th></tr>
{% for w in windows %}<tr><td>{{ w.span }}</td>{% for v in w.cells %}<td>{{ v }}</td>{% endfor %}
<td>{{ w.divergence }}</td><td>{{ w.sqdr }}</td><td>{{ w.hit }}</td></tr>
{% else %}<tr><td colspan="15" class="na">no window closed yet</td></tr>{% endfor %}</table>
<h2>Namespaces</h2>
<table class="data"><tr><th>namespace</th>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for name, row in spaces %}<tr><td>{{ name }}</td>{% for v in row %}<td>{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table>
<h2>Findings ({{ findings|length }})</h2>
<table class="data"><tr><th>kind</th><th>time</th><th>found after</th><th>request</th><th>namespace</th>
<th>prompt tokens</th><th>cached</th><th>bound</th><th>round</th><th>margin</th><th>top-k shift</th></tr>
{% for f in findings %}<tr><td class="{{ 'watch' if f.kind == 'warmup' else 'fail' }}">{{ f.kind }}</td>
<td>{{ '%.1f'|format(f.time) }}</td>
<td>{{ '%.1f s'|format(f.lag) if f.lag is defined and f.lag is not none else '-' }}</td>
<td>{{ f.request or '-' }}</td><td>{{ f.namespace }}</td>
<td>{{ f.prompt_tokens or '-' }}</td><td>{{ f.get('cached', '-') }}</td>
<td>{{ f.get('bound', '-') }}</td><td>{{ f.get('round', '-') }}</td>
<td>{{ '%.3f'|format(f.margin) if f.margin is defined and f.margin is not none else '-' }}</td>
<td>{{ '%.3f'|format(f.distance) if f.distance is defined and f.distance is not none else '-' }}</td></tr>
{% else %}<tr><td colspan="11" class="na">none</td></tr>{% endfor %}</table>
</body></html>
"""
