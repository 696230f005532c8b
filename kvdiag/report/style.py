"""The stylesheet every kvdiag HTML page inlines (no external resources), and the jinja2
template every page but the run report is compiled through (autoescaped, cached)."""

import functools

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 margin:0 auto;max-width:1100px;padding:0 16px 40px;color:#1b1b1b;background:#fff}
header{border-bottom:3px solid #888;margin-bottom:8px}
h1{font-size:24px;margin:18px 0 6px} h2{font-size:18px;margin:28px 0 6px}
.badge{display:inline-block;padding:2px 12px;border-radius:4px;color:#fff;margin-right:8px}
.verdict-pass .badge{background:#1a7f37} .verdict-fail .badge{background:#c0392b}
.verdict-inconclusive .badge{background:#b7791f;color:#1b1b1b}
.verdict-pass{border-color:#1a7f37} .verdict-fail{border-color:#c0392b}
.verdict-inconclusive{border-color:#b7791f}
.verdict-error .badge{background:#6b21a8} .verdict-error{border-color:#6b21a8}
p.meaning{margin:4px 0 8px;font-size:15px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}
dl.meta dt{font-weight:600;color:#444} dl.meta dd{margin:0;overflow-wrap:anywhere}
pre{background:#f4f4f4;border:1px solid #ddd;padding:8px;white-space:pre-wrap;
 overflow-wrap:anywhere} code{font-family:ui-monospace,"DejaVu Sans Mono",monospace}
figure.plot{margin:8px 0;border:1px solid #e3e3e3;padding:4px}
figure.plot svg{display:block;max-width:100%;height:auto;margin:0 auto}
figcaption,.note{color:#555;font-size:13px}
table.data{border-collapse:collapse;margin:8px 0;font-size:13px}
table.data caption{text-align:left;color:#555;padding:4px 0}
table.data th,table.data td{border:1px solid #ddd;padding:3px 8px;text-align:right}
table.data th{background:#f4f4f4} table.data td{white-space:nowrap}
table.data td:first-child{text-align:left}
td.healthy,td.pass{background:#dcf3e3;color:#11552a} td.watch{background:#fff1cc;color:#6b4d00}
td.alert,td.fail{background:#fadbd8;color:#8e2218;font-weight:600} td.na{color:#777}
nav a{margin-right:14px}
"""


@functools.cache
def template(source: str):
    """`source` compiled once: autoescape on, the page's final newline kept."""
    import jinja2

    return jinja2.Environment(autoescape=True, keep_trailing_newline=True).from_string(source)
