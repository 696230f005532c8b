"""What the per-round table says about one series against its ground truth (the contiguous
reference): the guard gate's failures (a series expected to stay flat) and the findings that
mark a series as corrupted (the positive control). Findings are strings "round N: ..."; the
verdicts they lead to are kvdiag.verdicts'. Pure functions over summary.json's `rounds`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdiag.vocab import BRAI_MAX, CLEAN_ALLOCATORS, CONTIGUOUS, VLLM

if TYPE_CHECKING:
    from pandas import DataFrame


@dataclass
class GateResult:
    passed: bool
    failures: list[str] = field(default_factory=list)  # "round 7: foreign_slots = 379 (want 0)"


def failing_rounds(findings: Iterable[str]) -> list[int]:
    """The round numbers of findings written "round N: ..."."""
    return sorted({int(f.split(":")[0].split()[1]) for f in findings if f.startswith("round ")})


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def series(rounds: Iterable[dict], case: str, name: str) -> list[dict]:
    """The per-round rows of one allocator (or target) in one case, by round."""
    rows = [r for r in rounds if r.get("case", case) == case
            and (r["allocator"] == name or r["target"] == name)]
    return sorted(rows, key=lambda r: r["round"])


def guard_gate(rows: list[dict], reference: list[dict], brai_max: float = BRAI_MAX) -> GateResult:
    """Every round: zero foreign and unwritten slots, zero leakage, no non-finite logits,
    BLEU-4 = 100, fact-check pass rate equal to the reference's, and BRAI <= brai_max."""
    if not rows:
        return GateResult(False, ["no rounds were measured"])
    ref = {r["round"]: r for r in reference}
    failures = []
    for r in rows:
        n = r["round"]
        checks = [
            ("foreign_slots", r.get("foreign_slots", 0), lambda v: v == 0, "0"),
            ("unwritten_slots", r.get("unwritten_slots", 0), lambda v: v == 0, "0"),
            ("nonfinite_logits", r.get("nonfinite_logits", 0), lambda v: v == 0, "0"),
            ("attention_leakage", r.get("attention_leakage"), lambda v: _nan(v) or v == 0, "0"),
            ("bleu4", r.get("bleu4"), lambda v: not _nan(v) and v >= 100 - 1e-9, "100"),
        ]
        want = ref.get(n, {}).get("fact_check_pass_rate")
        if not _nan(want):
            checks.append(("fact_check_pass_rate", r.get("fact_check_pass_rate"),
                           lambda v, w=want: not _nan(v) and abs(v - w) < 1e-9, f"{want:g} (reference)"))
        brai = r.get("brai")
        if not _nan(brai):
            checks.append(("brai", brai, lambda v: v <= brai_max + 1e-12, f"<= {brai_max}"))
        for name, value, ok, expect in checks:
            if not ok(value):
                shown = f"{value:.4g}" if isinstance(value, float) else value
                failures.append(f"round {n}: {name} = {shown} (want {expect})")
    return GateResult(not failures, failures)


def fault_findings(rows: list[dict], reference: list[dict]) -> list[str]:
    """What marks a series as corrupted (the positive control): any foreign or unwritten
    slot, leakage, non-finite logits, BLEU-4 below 100, or fact-checks below the reference."""
    ref = {r["round"]: r for r in reference}
    found = []
    for r in rows:
        n = r["round"]
        for key in ("foreign_slots", "unwritten_slots", "nonfinite_logits"):
            if r.get(key, 0):
                found.append(f"round {n}: {key} = {r[key]}")
        if not _nan(r.get("attention_leakage")) and r["attention_leakage"] > 0:
            found.append(f"round {n}: attention_leakage = {r['attention_leakage']:.4g}")
        if not _nan(r.get("bleu4")) and r["bleu4"] < 100 - 1e-9:
            found.append(f"round {n}: bleu4 = {r['bleu4']:.4g}")
        want = ref.get(n, {}).get("fact_check_pass_rate")
        got = r.get("fact_check_pass_rate")
        if not _nan(want) and not _nan(got) and got < want - 1e-9:
            found.append(f"round {n}: fact_check_pass_rate = {got:.4g} (reference {want:.4g})")
    return found


def expected_clean(name: str, ablation: bool) -> bool:
    """Series the guard gate applies to: guarded allocators, the correct allocators, and
    every allocator of an ablation (control) case."""
    return ablation or name.startswith("guarded") or name in CLEAN_ALLOCATORS




def rows_of(rounds: list[dict], case: str, name: str) -> tuple[list[dict], list[dict]]:
    """(the series' rows, the contiguous reference's rows) of one case."""
    rows_of_case = [r for r in rounds if r.get("case") == case]
    rows = series(rows_of_case, case, name)
    if name == VLLM:  # vLLM registers blocks when it schedules them, so its reuse differs
        # from our engine's by design (runners/replay/hit_diff.py): BRAI against our guarded
        # baseline is no anomaly signal for it
        rows = [{**r, "brai": None} for r in rows]
    return rows, series(rows_of_case, case, CONTIGUOUS)


def departure_rounds(table: DataFrame) -> dict[str, int | None]:
    """series -> first round whose outputs depart from the contiguous reference, or None.

    A round departs when any session's tokens diverge, BLEU-4 falls below 100, or the
    fact-check pass rate differs from the reference's in that round.
    """
    from kvdiag.metrics.decay import REFERENCE_ALLOCATORS

    reference = table[table["series"].isin(REFERENCE_ALLOCATORS)]
    ref_pass = dict(zip(reference["round"], reference["fact_check_pass_rate"]))
    out: dict[str, int | None] = {}
    for name, rows in table.groupby("series", sort=False):
        out[name] = None
        for rec in rows.sort_values("round").to_dict("records"):
            ref = ref_pass.get(rec["round"], math.nan)
            own = rec["fact_check_pass_rate"]
            if (rec["diverged_sessions"] > 0 or rec["bleu4"] < 100 - 1e-9
                    or (not math.isnan(ref) and not math.isnan(own) and abs(own - ref) > 1e-9)):
                out[name] = int(rec["round"])
                break
    return out
