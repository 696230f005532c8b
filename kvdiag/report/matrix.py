"""The detection matrix's self-contained page: the verdict, then one table row per fault and
path (the fault's class and the real reports it re-creates, the verdict against the expected
one, what was measured), each live row linked to its own run's report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvdiag.report.style import CSS, template

if TYPE_CHECKING:
    from kvdiag.record.summary import MatrixSummary

COLUMNS = (("fault", "fault"), ("path", "path"), ("class", "class"), ("event", "event"), ("verdict", "verdict"),
           ("expected", "expected"), ("caught_by", "caught by"), ("corrupted", "corrupted"),
           ("first_round", "first round"),
           ("requests_to_first", "requests to first"), ("numerics", "numerics"),
           ("seconds", "wall s"), ("reports", "real reports"))

# jinja2, autoescaped (as kvdiag.report.html): adjacent literals, so the page is one line
_PAGE = (
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>'
    '{{ verdict|upper }} · kvdiag detect</title><style>{{ css }}'
    ' tr.missed td{background:#f8d7da}</style></head><body>'
    '<header class="verdict-{{ verdict }}"><h1 id="verdict"><span class="badge">'
    '{{ verdict|upper }}</span>kvdiag · detection matrix · {{ engine }}'
    '</h1><p class="meaning" id="verdict-meaning">{{ reason }}</p>'
    '<dl class="meta"><dt>suite</dt><dd>{{ suite }}</dd>'
    '<dt>signature</dt><dd><code>{{ signature }}</code></dd>'
    '<dt>created</dt><dd>{{ created }}</dd></dl></header>'
    '<p class="note">audit: the fault planted into vLLM\'s own KVCacheManager in-process, '
    'the trace replayed model-free with a shadow content map; live: a real server kvdiag '
    'starts with the fault planted, probed (or audited for isolation) from outside. '
    'expected: the verdict a run that catches the fault gives; red rows were not caught.</p>'
    '<table id="T_matrix"><tr>{% for _, title in columns %}<th>{{ title }}</th>{% endfor %}</tr>'
    '{% for row, words in rows %}<tr class="{{ "caught" if row.caught else "missed" }}">'
    '{% for key, _ in columns %}{% set value = words.get(key) %}'
    '{% if key == "verdict" %}<td class="{{ value }}"><b>{{ value|string|upper }}</b>'
    '{% if row.run_dir %} <a href="{{ row.run_dir.split("/")[-1] }}/report.html">'
    'report</a>{% endif %}</td>'
    '{% else %}<td>{{ "-" if value is none else value }}</td>{% endif %}{% endfor %}</tr>'
    '{% endfor %}</table></body></html>\n')



def page(summary: MatrixSummary) -> str:
    """The matrix's rows (MatrixRow), each beside its JSON words: the template prints each
    column's word and reads whether it was caught and its run directory by attribute."""
    from markupsafe import Markup

    return template(_PAGE).render(
        css=Markup(CSS), verdict=summary.verdict.value, engine=summary.engine, reason=summary.reason,
        suite=summary.suite, signature=summary.signature, created=summary.created or "?",
        columns=COLUMNS, rows=[(r, r.model_dump(mode="json")) for r in summary.matrix])
