"""Terminal renderers of the runs that measure an engine: reproduce, verify, the live probe
and the vLLM audit (each returns the lines the CLI's Output prints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvdiag.report.terminal_style import compact_table, fmt, footer, headline
from kvdiag.verdicts import Verdict, judge_sentinel
from kvdiag.vocab import CONTIGUOUS

if TYPE_CHECKING:
    from kvdiag.record.evidence import KeyCoverage, TopK
    from kvdiag.record.summary import ReproduceSummary
    from kvdiag.record.summary_rows import EventRow


def rounds_table(summary: ReproduceSummary, case: str):
    """Round x allocator: reuse, leakage, BLEU-4, fact-check (reference's beside), foreign."""
    rows = [r for r in summary.rounds if r.case == case]
    ref = {r.round: r.fact_check_pass_rate for r in rows if r.allocator == CONTIGUOUS}
    table = compact_table(f"case {case}",
                          "facts: fact-check pass rate (ref: the contiguous reference's); foreign: "
                          "slots read from other prefixes; rejected: stale hits the guard dropped")
    for col in ("round", "allocator", "reuse", "leakage", "BLEU-4", "facts", "ref", "foreign", "rejected"):
        table.add_column(col, justify="left" if col == "allocator" else "right")
    rows = [r for r in rows if r.allocator != CONTIGUOUS]
    rows.sort(key=lambda r: (r.round, r.allocator))
    last = None
    for r in rows:
        name = r.allocator if r.target == "reference" else r.target
        bad = r.foreign_slots or r.nonfinite_logits or (r.bleu4 or 100) < 100
        table.add_row("" if r.round == last else str(r.round), name,
                      fmt(r.block_reuse_rate, ".3f"), fmt(r.attention_leakage, ".4f"),
                      fmt(r.bleu4, ".1f"), fmt(r.fact_check_pass_rate, ".2f"),
                      fmt(ref.get(r.round), ".2f"), str(r.foreign_slots), str(r.guard_rejections),
                      style="red" if bad else None, end_section=False)
        last = r.round
    return table


def verdict_lines(summary: ReproduceSummary) -> list[str]:
    lines = []
    for key, gate in summary.gates.items():
        state = "[green]flat[/]" if gate.passed else f"[red]NOT flat[/] ({len(gate.failures)} findings)"
        lines.append(f"  {key}: {state}")
        lines += [f"      {f}" for f in gate.failures[:5]]
    for key, findings in summary.faults.items():
        state = (f"[red]corruption reproduced[/] ({len(findings)} findings, first: {findings[0]})"
                 if findings else "[yellow]NOT reproduced: no corruption seen under the trigger[/]")
        lines.append(f"  {key}: {state}")
    for name, value in summary.sqdr.items():
        brai = summary.brai.get(name)
        lines.append(f"  {name}: SQDR {fmt(value, '.4f')}  BRAI {fmt(brai, '.4f')}")
    return lines


def render_reproduce(result) -> list:
    s = result.summary
    lines: list = [rounds_table(s, case) for case in s.cases]
    lines += [f"signature: {s.signature}", headline(result), *verdict_lines(s)]
    return lines + footer(result)[1:]


def render_verify(result) -> list:
    gate = result.summary.gate
    lines = [headline(result, f"{gate.name} --allocator {gate.allocator}: {gate.what}")]
    lines += [f"  {line}" for line in gate.shown]
    return lines + footer(result)


def render_probe(result) -> list:
    s, frame = result.summary, result.frame
    shared = frame[frame["allocator"] == "shared"]
    rows = {r.round: r for r in s.rounds if r.allocator == "shared"}
    # attention on slots read wrong, where a sentinel weighed it (kvdiag.sentinel.leakage)
    leak = any(r.attention_leakage is not None and r.attention_leakage == r.attention_leakage
               for r in rows.values())
    table = compact_table(f"probe {s.targets[0]} ({s.isolation} isolation)")
    for col in ("round", "BLEU-4", "fact-check", "ref fact", "diverged", "numerics", "corruption",
                "cached", *(("leakage",) if leak else ())):
        table.add_column(col, justify="right")
    ref = {r.round: r.fact_check_pass_rate for r in s.rounds if r.allocator == "isolated"}
    for n in sorted(rows):
        kinds = shared[shared["round"] == n]["classification"]
        r = rows[n]
        table.add_row(str(n), fmt(r.bleu4, ".1f"), fmt(r.fact_check_pass_rate, ".2f"),
                      fmt(ref.get(n), ".2f"),
                      str(int((kinds != "match").sum())), str(int((kinds == "numerics").sum())),
                      str(int((kinds == "corruption").sum())), fmt(r.block_reuse_rate, ".2f"),
                      *((fmt(r.attention_leakage, ".4f"),) if leak else ()),
                      style="red" if (kinds == "corruption").any() else None)
    nf, pc = s.noise_floor, s.server_prefix_cache
    lines = [table, f"noise floor: {nf.diverged_pairs}/{nf.pairs} repeated isolated requests "
             f"diverged, largest margin {nf.margin:.3f} nats (a stable ground truth stays within "
             f"the numerics margin, {nf.numerics_margin:.3f} nats)"]
    if pc.get("hit_rate") is not None:
        lines.append(f"server prefix cache (shared phase): {pc['hits']:.0f}/{pc['queries']:.0f} "
                     f"tokens hit ({pc['hit_rate']:.1%})")
    recycling = s.recycling
    if "recycling" in s.model_fields_set:
        seen = "observed" if recycling.observed else "NOT observed"
        lines.append(f"block recycling: {seen} ({recycling.how or 'no sign of it'})")
    truth = s.ground_truth
    if truth.isolated:
        lines.append(f"ground truth: {truth.contaminated} of {truth.isolated} isolated requests "
                     f"reported cached tokens (must be 0), {truth.unchecked} reported no "
                     "count (must be 0)")
    lines += _key_coverage_lines(s.key_coverage, "oracle" in s.key_coverage.model_fields_set)
    if s.sentinel is not None:  # its own reading, worded by the verdict module
        judged = judge_sentinel(s.sentinel)
        lines.append(judged.reason if judged.reason.startswith("sentinel: ") else
                     f"sentinel: {judged.reason}")
    lines += _event_lines(s.events, s.topk)
    what = ""
    if result.verdict is Verdict.FAIL and not s.corrupted_requests:
        what = s.reason
    elif result.verdict is Verdict.FAIL:
        where = s.corruption_where or (f"rounds {', '.join(map(str, s.corruption_rounds))}"
                                       if s.corruption_rounds else "outside the suite's rounds")
        what = f"corruption in {where} ({s.corrupted_requests} requests; {s.numerics_requests} numerics)"
        first = (s.first_divergences or [None])[0]
        if first and s.text == "withheld":  # --no-text: no token quoted
            what += f"; first divergent token: round {first.round} {first.session}"
        elif first:
            what += (f"; first divergent token: round {first.round} {first.session}: "
                     f"{first.shared_token!r} instead of {first.isolated_token!r}")
    elif result.verdict is Verdict.PASS:
        what = f"no divergence beyond the noise floor ({s.numerics_requests} numerics)"
    return lines + [headline(result, what), *footer(result)]


def _event_lines(events: list[EventRow], topk: TopK) -> list:
    """The coverage table (one row per event of a block's life) and the second channel."""
    out: list = []
    if events:
        table = compact_table("lifecycle coverage: the events this run reached")
        for col, justify in (("event", "left"), ("reached", "left"), ("requests", "right"),
                             ("evidence", "left")):
            table.add_column(col, justify=justify)
        for r in events:
            table.add_row(r.event, "yes" if r.reached else "NO", str(r.requests), r.evidence,
                          style=None if r.reached else "yellow")
        out.append(table)
    if topk.compared:
        out.append(f"top-k logprobs (first {topk.positions} tokens): {topk.compared} requests "
                   f"compared, largest shift {fmt(topk.largest, '.3f')} nats, floor "
                   f"{fmt(topk.floor, '.3f')}, threshold {fmt(topk.threshold, '.2f')}, "
                   f"{topk.departed} beyond it")
    return out


def _key_coverage_lines(kc: KeyCoverage, shown: bool) -> list[str]:
    """The over-hit oracle (where the run wrote one: `shown`) and the differential phase, as
    the judge left them."""
    oracle, pairs = kc.oracle, kc.differential
    lines = []
    if shown:
        lines.append(f"over-hit oracle: {oracle.checked} requests checked (unit "
                     f"{oracle.unit} tokens), {oracle.over_hits} over the bound"
                     if oracle.available else "over-hit oracle: unavailable (no cached-token "
                     "counts or no token ids)")
        lines += _accounting_lines(oracle.accounting)
    if pairs:
        families = sorted({p.family or "?" for p in pairs})
        skipped = kc.differential_skipped
        lines.append(f"differential phase: {len(pairs)} requests ({', '.join(families)})"
                     + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
    return lines


def _accounting_lines(groups) -> list[str]:
    """The hit accounting table: what each group reported cached against the most it could
    have. Not judged: an under-hit costs compute, not correctness."""
    if not groups:
        return []
    width = max(len(a.group) for a in groups)
    out = ["hit accounting (cached tokens reported against the most the client's own traffic "
           "allows; an under-hit is a cost, not corruption, and is not judged):",
           f"  {'group':<{width}}  requests  possible  reported  share  short  none"]
    for a in groups:
        share = f"{a.reported / a.possible:.0%}" if a.possible else "-"
        out.append(f"  {a.group:<{width}}  {a.requests:>8}  {a.possible:>8,}  {a.reported:>8,}  "
                   f"{share:>5}  {a.short:>5}  {a.none:>4}")
    return out


def _block_reuse(replay) -> dict[int, float]:
    """round -> blocks hit / blocks needed of a replay (vLLM's or ours)."""
    sums: dict[int, list[int]] = {}
    for r in replay.records if replay is not None else []:
        pair = sums.setdefault(r.round, [0, 0])
        pair[0] += r.blocks_hit
        pair[1] += r.blocks_needed
    return {n: hit / max(needed, 1) for n, (hit, needed) in sums.items()}


def render_audit(result) -> list:
    audit = result.summary.vllm_audit
    theirs, ours = _block_reuse(result.extra.vllm), _block_reuse(result.extra.ours)
    cmp = audit.compare
    table = compact_table(f"{audit.target} · case {result.summary.cases[0]} (hit rate: tokens; "
                          f"reuse: blocks; ours: {cmp.allocator if cmp else '-'})")
    for col in ("round", "hit rate", "reuse", "ours", "foreign", "unwritten", "sessions"):
        table.add_column(col, justify="right")
    for row in audit.rounds:
        n = row.round
        table.add_row(str(n), f"{row.vllm_hit_rate:.3f}", f"{theirs.get(n, 0):.3f}",
                      fmt(ours.get(n), ".3f"), str(row.foreign_slots), str(row.unwritten_slots),
                      ",".join(row.sessions_with_foreign_reads) or "-",
                      style="red" if row.foreign_slots or row.unwritten_slots else None)
    lines = [table, f"vLLM prefix cache (its own PrefixCacheStats): {audit.prefix_cache_hits} of "
             f"{audit.prefix_cache_queries} tokens hit ({audit.prefix_cache_hit_rate:.3f}), "
             f"{audit.preemptions} preemptions, {audit.steps} steps"]
    if cmp:
        lines.append(f"hit counts vs {cmp.allocator}: {cmp.requests_differing} of {cmp.requests} "
                     f"requests differ (ours {cmp.blocks_hit} blocks, vLLM {cmp.vllm_blocks_hit})")
        lines += [f"  {st.stage}: {st.requests_differing} differ" for st in cmp.explained[1:]]
    lines.append(f"invariant violations: {audit.invariant_violations}; cached blocks "
                 f"recycled: {audit.recycled_blocks}"
                 + (f"; planted fault: {result.summary.fault}" if result.summary.fault else ""))
    lines += [f"  {line}" for line in audit.invariant_messages[:10]]
    return lines + [headline(result), *footer(result)]


