"""The detection matrix's self-contained page: the verdict, then one table row per fault and
path (the fault's class and the real reports it re-creates, the verdict against the expected
one, what was measured), each live row linked to its own run's report."""

from __future__ import annotations

from html import escape

from kvdiag.report.style import CSS
from kvdiag.verdicts import Verdict

COLUMNS = (("fault", "fault"), ("path", "path"), ("class", "class"), ("event", "event"), ("verdict", "verdict"),
           ("expected", "expected"), ("caught_by", "caught by"), ("corrupted", "corrupted"),
           ("first_round", "first round"),
           ("requests_to_first", "requests to first"), ("numerics", "numerics"),
           ("seconds", "wall s"), ("reports", "real reports"))


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if key == "verdict":
        link = (f' <a href="{escape(row["run_dir"].split("/")[-1])}/report.html">report</a>'
                if row.get("run_dir") else "")
        return f'<td class="{escape(str(value))}"><b>{escape(str(value).upper())}</b>{link}</td>'
    return f"<td>{'-' if value is None else escape(str(value))}</td>"


def page(summary: dict) -> str:
    verdict = Verdict.parse(summary.get("verdict")).value
    rows = "".join(f'<tr class="{"caught" if r["caught"] else "missed"}">'
                   + "".join(_cell(r, key) for key, _ in COLUMNS) + "</tr>"
                   for r in summary.get("matrix", []))
    head = "".join(f"<th>{escape(title)}</th>" for _, title in COLUMNS)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>'
            f'{escape(verdict.upper())} · kvdiag detect</title><style>{CSS}'
            ' tr.missed td{background:#f8d7da}</style></head><body>'
            f'<header class="verdict-{escape(verdict)}"><h1 id="verdict"><span class="badge">'
            f'{escape(verdict.upper())}</span>kvdiag · detection matrix · {escape(summary.get("engine", "?"))}'
            f'</h1><p class="meaning" id="verdict-meaning">{escape(summary.get("reason", ""))}</p>'
            f'<dl class="meta"><dt>suite</dt><dd>{escape(summary.get("suite", "?"))}</dd>'
            f'<dt>signature</dt><dd><code>{escape(summary.get("signature", ""))}</code></dd>'
            f'<dt>created</dt><dd>{escape(str(summary.get("created", "?")))}</dd></dl></header>'
            '<p class="note">audit: the fault planted into vLLM\'s own KVCacheManager in-process, '
            'the trace replayed model-free with a shadow content map; live: a real server kvdiag '
            'starts with the fault planted, probed (or audited for isolation) from outside. '
            'expected: the verdict a run that catches the fault gives; red rows were not caught.</p>'
            f'<table id="T_matrix"><tr>{head}</tr>{rows}</table></body></html>\n')
