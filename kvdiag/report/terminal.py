"""Terminal rendering of finished runs: one renderer per kind of run, each returning the
lines (Rich markup strings and tables) that the CLI's Output prints. Library code never
prints; a new kind of run adds its renderer to RENDERERS."""

from __future__ import annotations

import math

from kvdiag.verdicts import Verdict
from kvdiag.vocab import CONTIGUOUS

COLOURS = {Verdict.PASS: "green", Verdict.FAIL: "red", Verdict.INCONCLUSIVE: "yellow",
           Verdict.ERROR: "magenta"}


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
    ref = {r["round"]: r for r in rows if r["allocator"] == CONTIGUOUS}
    table = compact_table(f"case {case}",
                          "facts: fact-check pass rate (ref: the contiguous reference's); foreign: "
                          "slots read from other prefixes; rejected: stale hits the guard dropped")
    for col in ("round", "allocator", "reuse", "leakage", "BLEU-4", "facts", "ref", "foreign", "rejected"):
        table.add_column(col, justify="left" if col == "allocator" else "right")
    rows = [r for r in rows if r["allocator"] != CONTIGUOUS]
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
                 if findings else "[yellow]NOT reproduced: no corruption seen under the trigger[/]")
        lines.append(f"  {key}: {state}")
    for name, value in (summary.get("sqdr") or {}).items():
        brai = (summary.get("brai") or {}).get(name)
        lines.append(f"  {name}: SQDR {_fmt(value, '.4f')}  BRAI {_fmt(brai, '.4f')}")
    return lines


def render(result) -> list:
    """The lines of a finished run, by its kind."""
    return RENDERERS.get(result.kind, _generic)(result)


def headline(result, what: str = "") -> str:
    """The verdict in colour and one sentence: `what`, else the summary's reason."""
    v = result.verdict
    reason = getattr(result.summary, "reason", "") or v.meaning
    return f"[bold {COLOURS[v]}]{v.value.upper()}[/] {what or reason}"


def _footer(result) -> list[str]:
    return [f"signature: {result.signature}",
            f"wall time {result.summary.wall_seconds:.1f} s; results in {result.run_dir}/ "
            "(report.html, results.parquet, summary.json)"]


def _generic(result) -> list:
    return [headline(result), *_footer(result)]


def _reproduce(result) -> list:
    s = result.summary.as_dict()
    lines: list = [rounds_table(s, case) for case in s["cases"]]
    lines += [f"signature: {s['signature']}", headline(result), *verdict_lines(s)]
    return lines + _footer(result)[1:]


def _verify(result) -> list:
    gate = result.summary.gate
    lines = [headline(result, f"{gate['name']} --allocator {gate['allocator']}: {gate['what']}")]
    lines += [f"  {line}" for line in gate["shown"]]
    return lines + _footer(result)


def _probe(result) -> list:
    s, frame = result.summary.as_dict(), result.frame
    shared = frame[frame["allocator"] == "shared"]
    table = compact_table(f"probe {s['targets'][0]} ({s['isolation']} isolation)")
    for col in ("round", "BLEU-4", "fact-check", "ref fact", "diverged", "numerics", "corruption", "cached"):
        table.add_column(col, justify="right")
    rows = {r["round"]: r for r in s["rounds"] if r["allocator"] == "shared"}
    ref = {r["round"]: r for r in s["rounds"] if r["allocator"] == "isolated"}
    for n in sorted(rows):
        kinds = shared[shared["round"] == n]["classification"]
        r = rows[n]
        table.add_row(str(n), _fmt(r["bleu4"], ".1f"), _fmt(r["fact_check_pass_rate"], ".2f"),
                      _fmt(ref.get(n, {}).get("fact_check_pass_rate"), ".2f"),
                      str(int((kinds != "match").sum())), str(int((kinds == "numerics").sum())),
                      str(int((kinds == "corruption").sum())), _fmt(r["block_reuse_rate"], ".2f"),
                      style="red" if (kinds == "corruption").any() else None)
    nf, pc = s["noise_floor"], s["server_prefix_cache"]
    lines = [table, f"noise floor: {nf['diverged_pairs']}/{nf['pairs']} repeated isolated requests "
             f"diverged, largest margin {nf['margin']:.3f} nats; corruption threshold "
             f"{nf['threshold']:.3f} nats"]
    if pc.get("hit_rate") is not None:
        lines.append(f"server prefix cache (shared phase): {pc['hits']:.0f}/{pc['queries']:.0f} "
                     f"tokens hit ({pc['hit_rate']:.1%})")
    recycling = s.get("recycling") or {}
    if recycling:
        seen = "observed" if recycling.get("observed") else "NOT observed"
        lines.append(f"block recycling: {seen} ({recycling.get('how') or 'no sign of it'})")
    truth = s.get("ground_truth") or {}
    if truth.get("isolated"):
        lines.append(f"ground truth: {truth['contaminated']} of {truth['isolated']} isolated requests "
                     f"reported cached tokens (must be 0)")
    what = ""
    if result.verdict is Verdict.FAIL:
        what = (f"corruption in rounds {s['corruption_rounds']} ({s['corrupted_requests']} requests; "
                f"{s['numerics_requests']} numerics)")
        first = (s.get("first_divergences") or [None])[0]
        if first:
            what += (f"; first divergent token: round {first['round']} {first['session']}: "
                     f"{first['shared_token']!r} instead of {first['isolated_token']!r}")
    elif result.verdict is Verdict.PASS:
        what = f"no divergence beyond the noise floor ({s['numerics_requests']} numerics)"
    return lines + [headline(result, what), *_footer(result)]


def _block_reuse(replay) -> dict[int, float]:
    """round -> blocks hit / blocks needed of a replay (vLLM's or ours)."""
    sums: dict[int, list[int]] = {}
    for r in replay.records if replay is not None else []:
        pair = sums.setdefault(r.round, [0, 0])
        pair[0] += r.blocks_hit
        pair[1] += r.blocks_needed
    return {n: hit / max(needed, 1) for n, (hit, needed) in sums.items()}


def _audit(result) -> list:
    audit = result.summary.vllm_audit
    theirs, ours = _block_reuse(result.extra["vllm"]), _block_reuse(result.extra["ours"])
    table = compact_table(f"{audit['target']} · case {result.summary.cases[0]} (hit rate: tokens; "
                          f"reuse: blocks; ours: {audit.get('compare', {}).get('allocator', '-')})")
    for col in ("round", "hit rate", "reuse", "ours", "foreign", "unwritten", "sessions"):
        table.add_column(col, justify="right")
    for row in audit["rounds"]:
        n = row["round"]
        table.add_row(str(n), f"{row['vllm_hit_rate']:.3f}", f"{theirs.get(n, 0):.3f}",
                      _fmt(ours.get(n), ".3f"), str(row["foreign_slots"]), str(row["unwritten_slots"]),
                      ",".join(row["sessions_with_foreign_reads"]) or "-",
                      style="red" if row["foreign_slots"] or row["unwritten_slots"] else None)
    lines = [table, f"vLLM prefix cache (its own PrefixCacheStats): {audit['prefix_cache_hits']} of "
             f"{audit['prefix_cache_queries']} tokens hit ({audit['prefix_cache_hit_rate']:.3f}), "
             f"{audit['preemptions']} preemptions, {audit['steps']} steps"]
    cmp = audit.get("compare")
    if cmp:
        lines.append(f"hit counts vs {cmp['allocator']}: {cmp['requests_differing']} of {cmp['requests']} "
                     f"requests differ (ours {cmp['blocks_hit']} blocks, vLLM {cmp['vllm_blocks_hit']})")
        lines += [f"  {st['stage']}: {st['requests_differing']} differ" for st in cmp["explained"][1:]]
    lines.append(f"invariant violations: {audit['invariant_violations']}; cached blocks "
                 f"recycled: {audit.get('recycled_blocks', 0)}"
                 + (f"; planted fault: {result.summary.fault}" if result.summary.fault else ""))
    lines += [f"  {line}" for line in audit["invariant_messages"][:10]]
    return lines + [headline(result), *_footer(result)]


def _regress(result) -> list:
    reg = result.summary.as_dict()["regress"]
    table = compact_table(f"regress {reg['target']} · suite {result.summary.suite}")
    for col in ("case", "series", "SQDR", "BRAI", "reuse", "leakage", "divergence"):
        table.add_column(col, justify="left" if col in ("case", "series") else "right")
    for case, m in reg["measurement"].items():
        table.add_row(case, m["series"], *(("-" if v is None else f"{v:.4f}") for v in (
            m["sqdr"], reg["brai"].get(case), m["block_reuse_rate"], m["attention_leakage"],
            m["divergence_ratio"])))
    lines: list = [table]
    lines.append(f"signature: {result.summary.signature}")
    base = reg["baseline"]
    lines.append(f"baseline: {base['run_id']} ({base['target']}, {base['created']}) key {base['key_id']}"
                  if base else "baseline: none (ground-truth check only)")
    if result.verdict is not Verdict.FAIL:
        lines.append(headline(result))
    else:
        named = ", ".join(f"{m} (rounds {', '.join(map(str, r)) if r != [0] else 'whole run'})"
                          for m, r in reg["regressed"].items())
        lines.append(headline(result, f"regressed: {named or 'nothing against the baseline'}"))
        against = [c for c in reg["failed_checks"] if c["metric"] != "ground_truth"]
        for c in against[:25]:
            lines.append(f"  {c['message']}")
        if len(against) > 25:
            lines.append(f"  ... {len(against) - 25} more in summary.json (regress.failed_checks)")
        for c in reg["failed_checks"]:
            if c["metric"] == "ground_truth":
                first = c["message"].split("; ")[0]
                lines.append(f"  {c['case']}: {int(c['value'])} ground-truth finding(s) against the "
                              f"run's own reference, first: {first}")
    junit = result.extra.get("junit")
    lines.append(f"run {reg['run_id']}: {result.run_dir}/report.html"
                 + (f"; JUnit {junit}" if junit else ""))
    return lines


def _isolation(result) -> list:
    """The attacker's correct vs wrong guesses per (configuration, length), then the verdict."""
    from rich.table import Table

    iso = result.extra["isolation"]
    table = Table(title="the attacker's correct (ok) vs wrong (bad) guesses", title_justify="left")
    for col in ("config", "tokens", "cached ok/bad", "TTFT ok/bad ms", "AUC", "p", "told apart"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for c in sorted(iso.cells, key=lambda c: (c["config"], c["length"])):
        told = {(True, True): "both", (True, False): "content", (False, True): "timing"}.get(
            (c["content_leak"], c["timing_leak"]), "no")
        table.add_row(c["config"], str(c["length"]), f"{c['cached_correct_mean']:.0f} / {c['cached_wrong_mean']:.0f}",
                      f"{c['ttft_correct_median_s'] * 1e3:.0f} / {c['ttft_wrong_median_s'] * 1e3:.0f}",
                      f"{c['auc']:.2f}", f"{c['p_value']:.2g}", told)
    lines: list = [table]
    exposed = sorted((c for c in iso.cells if c["config"] == "no-salt" and c["leaks"]),
                     key=lambda c: c["length"])
    if exposed:
        worst = exposed[-1]
        lines.append(f"exposure without salts (not judged): prefixes told apart at "
                     f"{', '.join(str(c['length']) for c in exposed)} tokens; at {worst['length']}: "
                     f"AUC {worst['auc']:.2f}, cached {worst['cached_correct_mean']:.0f} vs "
                     f"{worst['cached_wrong_mean']:.0f}")
    return lines + [headline(result),
                    f"{iso.requests} requests, {iso.wall_seconds:.1f} s; run directory {result.run_dir}"]


def _fleet(result) -> list:
    verdict = result.verdict
    return [f"[bold {COLOURS[verdict]}]{verdict.value.upper()}[/] fleet {result.run_dir}: "
            f"{result.judgement.reason}; page {result.page}"]


def _matrix(result) -> list:
    s = result.summary
    table = compact_table(f"detection matrix · {s.engine} · suite {s.suite}",
                          "to first: requests sent until the first corrupted one; - where none "
                          "was or the path measures none")
    for col in ("fault", "path", "verdict", "expected", "corrupted", "round", "to first",
                "numerics", "s"):
        table.add_column(col, justify="left" if col in ("fault", "path", "verdict", "expected")
                         else "right", no_wrap=True)
    for r in s.matrix:
        table.add_row(r["fault"], r["path"], r["verdict"].upper(), r["expected"],
                      *(("-" if r[k] is None else str(r[k])) for k in
                        ("corrupted", "first_round", "requests_to_first", "numerics", "seconds")),
                      style=None if r["caught"] else "red")
    return [table, headline(result), *_footer(result)]


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
        numbers = [_fmt(row[c], ".4f") for c in ("sqdr", "brai", "divergence_ratio")]
        table.add_row(str(row["created"])[:16].replace("T", " "), str(row["run_id"]), str(row["target"]),
                      str(row["verdict"]), *numbers,
                      style=None if row["verdict"] == "pass" else "red" if row["verdict"] == "fail" else "yellow")
    return table


RENDERERS = {"matrix": _matrix, "reproduce": _reproduce, "verify": _verify, "probe": _probe, "audit": _audit,
             "regress": _regress, "isolation": _isolation, "fleet": _fleet}
