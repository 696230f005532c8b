"""Terminal rendering of run results (Rich tables); library code never prints."""

from __future__ import annotations

import math


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def compact_table(title: str, caption: str | None = None):
    """A Rich table without vertical rules, so wide round tables fit an 80-column terminal."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True,
                 caption=caption, caption_justify="left")


def rounds_table(summary: dict, case: str):
    """Round x allocator: reuse, leakage, BLEU-4, fact-check (reference's beside), foreign."""
    rows = [r for r in summary["rounds"] if r.get("case") == case]
    ref = {r["round"]: r for r in rows if r["allocator"] == "contiguous"}
    table = compact_table(f"case {case}",
                          "facts: fact-check pass rate (ref: the contiguous reference's); foreign: "
                          "slots read from other prefixes; rejected: stale hits the guard dropped")
    for col in ("round", "allocator", "reuse", "leakage", "BLEU-4", "facts", "ref", "foreign", "rejected"):
        table.add_column(col, justify="left" if col == "allocator" else "right")
    rows = [r for r in rows if r["allocator"] != "contiguous"]
    rows.sort(key=lambda r: (r["round"], r["allocator"]))
    last = None
    for r in rows:
        name = r["allocator"] if r["target"] == "reference" else r["target"]
        bad = r["foreign_slots"] or r.get("nonfinite_logits") or (r["bleu4"] or 100) < 100
        style = "red" if bad else None
        table.add_row("" if r["round"] == last else str(r["round"]), name,
                      _fmt(r["block_reuse_rate"], ".3f"), _fmt(r["attention_leakage"], ".4f"),
                      _fmt(r["bleu4"], ".1f"), _fmt(r["fact_check_pass_rate"], ".2f"),
                      _fmt(ref.get(r["round"], {}).get("fact_check_pass_rate"), ".2f"),
                      str(r["foreign_slots"]), str(r.get("guard_rejections", 0)), style=style,
                      end_section=False)
        last = r["round"]
    return table


def verdict_lines(summary: dict) -> list[str]:
    lines = []
    for key, gate in summary.get("gates", {}).items():
        state = "[green]flat[/]" if gate["passed"] else f"[red]NOT flat[/] ({len(gate['failures'])} findings)"
        lines.append(f"  {key}: {state}")
        lines += [f"      {f}" for f in gate["failures"][:5]]
    for key, findings in summary.get("faults", {}).items():
        state = (f"[red]corruption reproduced[/] ({len(findings)} findings, first: {findings[0]})"
                 if findings else "[yellow]no corruption seen[/]")
        lines.append(f"  {key}: {state}")
    for name, value in (summary.get("sqdr") or {}).items():
        brai = (summary.get("brai") or {}).get(name)
        lines.append(f"  {name}: SQDR {_fmt(value, '.4f')}  BRAI {_fmt(brai, '.4f')}")
    return lines
