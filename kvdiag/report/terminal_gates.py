"""Terminal renderers of the runs that gate: regress, the isolation audit, a fleet, the
detection matrix; and the history's table."""

from __future__ import annotations

from kvdiag.report.terminal_style import COLOURS, compact_table, fmt, footer, headline
from kvdiag.verdicts import Verdict


def render_regress(result) -> list:
    reg = result.summary.regress  # a RegressBlock
    table = compact_table(f"regress {reg.target} · suite {result.summary.suite}")
    for col in ("case", "series", "SQDR", "BRAI", "reuse", "leakage", "divergence"):
        table.add_column(col, justify="left" if col in ("case", "series") else "right")
    for case, m in reg.measurement.items():
        table.add_row(case, m.series, *(("-" if v is None else f"{v:.4f}") for v in (
            m.sqdr, reg.brai.get(case), m.block_reuse_rate, m.attention_leakage, m.divergence_ratio)))
    lines: list = [table]
    lines.append(f"signature: {result.summary.signature}")
    base = reg.baseline
    lines.append(f"baseline: {base.run_id} ({base.target}, {base.created}) key {base.key_id}"
                  if base else "baseline: none (ground-truth check only)")
    if result.verdict is not Verdict.FAIL:
        lines.append(headline(result))
    else:
        named = ", ".join(f"{m} (rounds {', '.join(map(str, r)) if r != [0] else 'whole run'})"
                          for m, r in reg.regressed.items())
        lines.append(headline(result, f"regressed: {named or 'nothing against the baseline'}"))
        against = [c for c in reg.failed_checks if c.metric != "ground_truth"]
        for c in against[:25]:
            lines.append(f"  {c.message}")
        if len(against) > 25:
            lines.append(f"  ... {len(against) - 25} more in summary.json (regress.failed_checks)")
        for c in reg.failed_checks:
            if c.metric == "ground_truth":
                first = c.message.split("; ")[0]
                lines.append(f"  {c.case}: {int(c.value or 0)} ground-truth finding(s) against the "
                              f"run's own reference, first: {first}")
    junit = result.extra.junit
    lines.append(f"run {reg.run_id}: {result.run_dir}/report.html"
                 + (f"; JUnit {junit}" if junit else ""))
    return lines


def render_isolation(result) -> list:
    """The attacker's correct vs wrong guesses per (configuration, length), as the judge flagged
    them (the summary's cells), then the verdict."""
    from rich.table import Table

    iso, cells = result.extra.isolation, result.summary.isolation.cells
    table = Table(title="the attacker's correct (ok) vs wrong (bad) guesses", title_justify="left")
    for col in ("config", "tokens", "cached ok/bad", "TTFT ok/bad ms", "AUC", "p", "told apart"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for c in sorted(cells, key=lambda c: (c.config, c.length)):
        told = {(True, True): "both", (True, False): "content", (False, True): "timing"}.get(
            (bool(c.content_leak), bool(c.timing_leak)), "no")
        table.add_row(c.config, str(c.length), f"{c.cached_correct_mean:.0f} / {c.cached_wrong_mean:.0f}",
                      f"{c.ttft_correct_median_s * 1e3:.0f} / {c.ttft_wrong_median_s * 1e3:.0f}",
                      f"{c.auc:.2f}", f"{c.p_value:.2g}", told)
    lines: list = [table]
    exposed = sorted((c for c in cells if c.config == "no-salt" and c.leaks), key=lambda c: c.length)
    if exposed:
        worst = exposed[-1]
        lines.append(f"exposure without salts (not judged): prefixes told apart at "
                     f"{', '.join(str(c.length) for c in exposed)} tokens; at {worst.length}: "
                     f"AUC {worst.auc:.2f}, cached {worst.cached_correct_mean:.0f} vs "
                     f"{worst.cached_wrong_mean:.0f}")
    return lines + [headline(result),
                    f"{iso.requests} requests, {iso.wall_seconds:.1f} s; run directory {result.run_dir}"]


def render_fleet(result) -> list:
    verdict = result.verdict
    return [f"[bold {COLOURS[verdict]}]{verdict.value.upper()}[/] fleet {result.run_dir}: "
            f"{result.judgement.reason}; page {result.page}"]


def render_matrix(result) -> list:
    s = result.summary
    table = compact_table(f"detection matrix · {s.engine} · suite {s.suite}",
                          "to first: requests landed until the first detection (a corrupted "
                          "answer of a shared round or the lifecycle phase, once it and its "
                          "isolated twin had landed; an over-hit; a sentinel finding's reader); "
                          "- where none was, the path measures none, "
                          "or only a differential pair's answer caught it (counted in corrupted, "
                          "not placed)")
    for col in ("fault", "path", "event", "verdict", "expected", "caught by", "corrupted", "round",
                "to first", "numerics", "s"):
        table.add_column(col, justify="left" if col in ("fault", "path", "event", "verdict", "expected",
                                                        "caught by") else "right", no_wrap=col != "caught by")
    for r in s.matrix:
        table.add_row(r.fault, r.path, r.event, r.verdict.value.upper(), r.expected.value, r.caught_by,
                      *("-" if v is None else str(v) for v in
                        (r.corrupted, r.first_round, r.requests_to_first, r.numerics, r.seconds)),
                      style=None if r.caught else "red")
    return [table, headline(result), *footer(result)]


HISTORY_COLUMNS = ("created", "run_id", "suite", "target", "engine", "engine_version", "model",
                   "verdict", "sqdr", "brai", "divergence_ratio", "key_id", "run_dir")


def history_records(frame) -> list[dict]:
    """The history's rows as `kvdiag history --json` prints them (HISTORY_COLUMNS)."""
    import json

    return json.loads(frame[list(HISTORY_COLUMNS)].to_json(orient="records"))


def history_table(frame, title: str):
    """Past regression runs (the history's `runs` rows), oldest first."""
    table = compact_table(title)
    for col in ("created", "run", "target", "verdict", "SQDR", "BRAI", "diverged"):
        table.add_column(col, justify="right" if col in ("SQDR", "BRAI", "diverged") else "left",
                         overflow="fold")
    for row in frame.to_dict("records"):
        numbers = [fmt(row[c], ".4f") for c in ("sqdr", "brai", "divergence_ratio")]
        table.add_row(str(row["created"])[:16].replace("T", " "), str(row["run_id"]), str(row["target"]),
                      str(row["verdict"]), *numbers,
                      style=None if row["verdict"] == "pass" else "red" if row["verdict"] == "fail" else "yellow")
    return table


