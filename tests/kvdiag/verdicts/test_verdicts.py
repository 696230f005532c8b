"""One verdict, everywhere: the judges' rules (kvdiag.verdicts), and a check of the source
that no other module assigns a verdict value (only kvdiag.verdicts may write pass, fail,
inconclusive or error; everything else reads them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvdiag.record.evidence import BoundedHit, Oracle, Recycling
from kvdiag.verdicts import (
    ProbeEvidence,
    Verdict,
    classify_divergence,
    judge_fleet,
    judge_gate,
    judge_matrix,
    judge_probe,
    judge_reference,
    judge_regress,
    judge_series,
    logprob_departed,
    over_hit,
)

ROOT = Path(__file__).resolve().parents[3]
VALUES = {v.value for v in Verdict} | {v.value.upper() for v in Verdict}
MEMBERS = {v.name for v in Verdict}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _reading(node: ast.AST, parents: dict) -> bool:
    """A verdict literal used to read one: inside a comparison (`v is Verdict.PASS`,
    `x in ("pass", "fail")`), as a dict key (a colour per verdict), or as a subscript."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.Dict) and child in parent.keys:
            return True
        if isinstance(parent, ast.Subscript) and child is parent.slice:
            return True
        if isinstance(parent, ast.Call) and child in parent.args and child.__class__ is ast.Constant:
            return True  # a label passed to a reader: run.count("corruption")
        if not isinstance(parent, (ast.Tuple, ast.List, ast.Set, ast.Attribute)):
            return False
        child, parent = parent, parents.get(parent)
    return False


def _verdictish(name: str) -> bool:
    return "verdict" in name.lower() or "status" in name.lower()


def _target_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def _literal_writes(tree: ast.AST) -> list[ast.AST]:
    """Verdict words written where a verdict is stored: assigned to a name, attribute or key
    called *verdict* or *status*, a dict's "verdict"/"status" value, or such a keyword."""
    def words(value):
        return [n for n in ast.walk(value) if isinstance(n, ast.Constant) and n.value in VALUES]

    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_verdictish(_target_name(t)) for t in targets):
                out += words(node.value)
        elif isinstance(node, ast.Dict):
            out += [w for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                    and isinstance(k.value, str) and _verdictish(k.value) for w in words(v)]
        elif isinstance(node, ast.keyword) and node.arg and _verdictish(node.arg):
            out += words(node.value)
    return out


LABELS = {"corruption", "numerics", "over-hit", "leak"}  # what the judges classify


def _classifications(tree: ast.AST) -> list[ast.AST]:
    """Classifications decided outside the judge: a label returned, or stored under a name or
    key called *classification*/*label*; and verdicts built from strings (`Verdict("pass")`)."""
    def labels(value):
        return [n for n in ast.walk(value) if isinstance(n, ast.Constant) and n.value in LABELS]

    def labelish(name: str) -> bool:
        return "classification" in name.lower() or "label" in name.lower()

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None:
            out += labels(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(labelish(_target_name(t)) for t in targets):
                out += labels(node.value)
        elif isinstance(node, ast.keyword) and node.arg and labelish(node.arg):
            out += labels(node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Verdict"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append(node)
    return out


def _assignments(path: Path) -> list[str]:
    """Every verdict value written in `path`: a Verdict member outside a reading position,
    a verdict word stored as a verdict (_literal_writes), or a classification (_classifications)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = _parents(tree)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in MEMBERS
             and isinstance(n.value, ast.Name) and n.value.id == "Verdict"
             and not _reading(n, parents)]
    found += [n for n in _literal_writes(tree) if not _reading(n, parents)]
    found += [n for n in _classifications(tree) if not _reading(n, parents)]
    return [f"{path.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}" for n in found]


def test_no_module_but_the_verdict_module_assigns_a_verdict():
    sources = [p for package in ("kvdiag", "reference_engine") for p in (ROOT / package).rglob("*.py")
               if (ROOT / "kvdiag" / "verdicts") not in p.parents]
    assigned = [line for p in sources for line in _assignments(p)]
    assert not assigned, "verdicts assigned outside kvdiag/verdicts/:\n" + "\n".join(assigned)


def test_the_source_check_can_fail(tmp_path):
    """The check above sees an assignment where there is one."""
    (tmp_path / "kvdiag").mkdir()
    bad = tmp_path / "kvdiag" / "x.py"
    bad.write_text('summary = {"verdict": "pass"}\nv = Verdict.FAIL\nok = v is Verdict.PASS\n'
                   'status = "FAIL" if ok else "ERROR"\ncss = "pass"\n'
                   'label = "numerics" if m < 1 else "corruption"\nw = Verdict("pass")\n'
                   'def f(m):\n    return "corruption" if m > 1 else "match"\n'
                   'n = sum(c == "corruption" for c in labels)\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        # not the comparisons, not the CSS class
        assert len(_assignments(bad)) == 8, _assignments(bad)
    finally:
        ROOT = saved


def test_exit_codes_and_order():
    assert [v.exit_code for v in Verdict] == [0, 1, 2, 2]
    assert Verdict.worst([Verdict.PASS, Verdict.INCONCLUSIVE]) is Verdict.INCONCLUSIVE
    assert Verdict.worst([Verdict.ERROR, Verdict.FAIL]) is Verdict.FAIL
    assert Verdict.parse("no such verdict") is Verdict.ERROR  # never a silent pass


def _row(allocator, rnd, foreign=0, case="c"):
    return {"case": case, "target": "reference", "allocator": allocator, "round": rnd,
            "foreign_slots": foreign, "bleu4": 100.0 if not foreign else 80.0,
            "fact_check_pass_rate": 1.0, "attention_leakage": None, "brai": 0.0}


def test_a_clean_series_without_recycling_proves_nothing():
    rounds = [_row("contiguous", 1), _row("guarded", 1)]
    assert judge_reference(rounds, [("c", False)], {"c": {"guarded": 0}}).verdict is Verdict.INCONCLUSIVE
    assert judge_reference(rounds, [("c", False)], {"c": {"guarded": 5}}).verdict is Verdict.PASS
    # an ablation (control) case passes flat without recycling: its point is the absence
    assert judge_reference(rounds, [("c", True)], {"c": {"guarded": 0}}).verdict is Verdict.PASS


def test_a_faulty_series_that_shows_nothing_is_not_reproduced():
    rounds = [_row("contiguous", 1), _row("guarded", 1), _row("buggy", 1)]
    judged = judge_reference(rounds, [("c", False)], {"c": {"buggy": 9, "guarded": 9}})
    assert judged.verdict is Verdict.INCONCLUSIVE and "not reproduced" in judged.reason
    rounds[-1] = _row("buggy", 1, foreign=40)
    assert judge_reference(rounds, [("c", False)], {"c": {}}).verdict is Verdict.PASS


def test_the_guard_gate_needs_recycling():
    rounds = [_row("contiguous", 1), _row("guarded", 1)]
    log = {"c/guarded": ["Using SequenceGuard for block allocation."]}
    assert judge_gate(rounds, log, "c", "guarded", True, recycled=12).verdict is Verdict.PASS
    assert judge_gate(rounds, log, "c", "guarded", True, recycled=0).verdict is Verdict.INCONCLUSIVE
    assert judge_gate(rounds, {}, "c", "guarded", True, recycled=12).verdict is Verdict.FAIL


def test_a_series_under_test():
    assert judge_series([], recycled=False, name="c/buggy").verdict is Verdict.INCONCLUSIVE
    assert judge_series([], recycled=True, name="c/guarded").verdict is Verdict.PASS
    assert judge_series(["round 3: foreign_slots = 9"], False, "c/buggy").verdict is Verdict.FAIL


def evidence(**kw) -> ProbeEvidence:
    """A probe's evidence: sound and clean unless `kw` says otherwise."""
    base = dict(divergences=[], floor_margins=[], numerics_margin=1.0, isolated=48, contaminated=0,
                unchecked=0, isolation="cache_salt", recycling=Recycling(observed=True, how="x"),
                pool="p", oracle=Oracle(available=True, checked=10), answered=10)
    return ProbeEvidence(**(base | kw))


@pytest.mark.parametrize("contaminated,corrupted,observed,want", [
    (0, 0, True, Verdict.PASS), (0, 3, True, Verdict.FAIL), (0, 0, False, Verdict.INCONCLUSIVE),
    (2, 0, True, Verdict.ERROR), (2, 3, True, Verdict.FAIL)])
def test_the_probe_checks_its_ground_truth(contaminated, corrupted, observed, want):
    judged = judge_probe(evidence(divergences=[("4", 7.5)] * corrupted, contaminated=contaminated,
                                  recycling=Recycling(observed=observed, how="cached fractions fell")))
    assert judged.verdict is want
    if want is Verdict.ERROR:
        assert judged.reason.startswith(f"ground truth contaminated: {contaminated} of 48")


def test_a_ground_truth_no_count_proves_is_an_error_naming_the_flags():
    judged = judge_probe(evidence(unchecked=48))
    assert judged.verdict is Verdict.ERROR and "0 cached tokens" not in judged.reason
    assert "--enable-prompt-tokens-details" in judged.reason and "--enable-cache-report" in judged.reason
    assert judge_probe(evidence(isolated=0)).verdict is Verdict.ERROR  # nothing isolated at all
    # a departure is still a fail
    assert judge_probe(evidence(unchecked=48, divergences=[("2", 3.0)])).verdict is Verdict.FAIL


def test_the_noise_floor_is_bounded_not_raised():
    """A decisive disagreement between two isolated runs is an unstable ground truth (error),
    never a higher threshold that turns corruption into numerics."""
    unstable = judge_probe(evidence(floor_margins=[0.2, 6.0]))
    assert unstable.verdict is Verdict.ERROR and unstable.reason.startswith("ground truth unstable")
    # the same departures are judged against the numerics margin, not the floor: a fail
    judged = judge_probe(evidence(floor_margins=[6.0], divergences=[("3", 2.5), ("5", 0.4)]))
    assert judged.verdict is Verdict.FAIL and judged.details.corrupted == 1
    assert judged.details.numerics == 1 and judged.details.unstable_floor == 1
    assert judge_probe(evidence(floor_margins=[0.3, 0.9])).verdict is Verdict.PASS


def test_an_over_hit_fails_whatever_the_answers_say():
    hit = BoundedHit(what="pair 'slot 5'", cached=64, bound=16, margin=float("nan"))
    fine = BoundedHit(what="pair 'slot 4'", cached=16, bound=16, margin=None)
    judged = judge_probe(evidence(hits=[fine, hit]))
    assert judged.verdict is Verdict.FAIL and judged.details.over_hits == 1
    assert "64 cached, at most 16" in judged.reason and "0 of the 1" in judged.reason
    assert judge_probe(evidence(hits=[fine])).verdict is Verdict.PASS
    unreported = BoundedHit(what="x", cached=None, bound=16, margin=None)
    assert judge_probe(evidence(hits=[unreported])).verdict is Verdict.PASS
    # the differential phase alone needs no recycling; a suite run does
    alone = evidence(recycling=Recycling(observed=False, how="-"), requires_recycling=False)
    assert judge_probe(alone).verdict is Verdict.PASS
    assert "no recycling needed" in judge_probe(alone).reason


def test_classifications_are_the_judges():
    assert classify_divergence(float("nan"), 1.0) == "match"
    assert classify_divergence(1.0, 1.0) == "numerics"
    assert classify_divergence(1.01, 1.0) == "corruption"
    assert over_hit(17, 16) and not over_hit(16, 16) and not over_hit(None, 0)
    assert logprob_departed(False, 0.0, 1.0) and not logprob_departed(True, 0.5, 1.0)


def test_a_regression_run_is_never_better_than_its_ground_truth():
    assert judge_regress(Verdict.INCONCLUSIVE, "no recycling", []).verdict is Verdict.INCONCLUSIVE
    assert judge_regress(Verdict.INCONCLUSIVE, "no recycling", ["bleu4"]).verdict is Verdict.FAIL
    assert judge_regress(Verdict.ERROR, "contaminated", []).verdict is Verdict.ERROR
    assert judge_regress(Verdict.PASS, "held", []).verdict is Verdict.PASS
    assert judge_regress(Verdict.PASS, "held", [], ["trigger: round 7"]).verdict is Verdict.ERROR
    assert judge_regress(Verdict.PASS, "held", ["bleu4"], ["trigger: round 7"]).verdict is Verdict.FAIL


def test_a_fleet_is_its_worst_cell():
    assert judge_fleet([]).verdict is Verdict.ERROR  # no evidence is never a pass
    assert Verdict.worst([]) is Verdict.ERROR
    assert judge_fleet([Verdict.PASS, Verdict.INCONCLUSIVE]).verdict is Verdict.INCONCLUSIVE
    assert judge_fleet([Verdict.ERROR, Verdict.PASS]).verdict.exit_code == 2
    assert judge_fleet([Verdict.ERROR, Verdict.FAIL]).verdict is Verdict.FAIL


def test_the_detection_matrix():
    rows = [("healthy", Verdict.PASS, Verdict.PASS), ("stale-hash", Verdict.FAIL, Verdict.FAIL)]
    assert judge_matrix(rows).verdict is Verdict.PASS
    assert judge_matrix(rows + [("partial-hash", Verdict.PASS, Verdict.FAIL)]).verdict is Verdict.FAIL
    assert judge_matrix([("healthy", Verdict.FAIL, Verdict.PASS)]).verdict is Verdict.FAIL
    assert judge_matrix(rows + [("x", Verdict.INCONCLUSIVE, Verdict.FAIL)]).verdict is Verdict.INCONCLUSIVE
    assert judge_matrix([]).verdict is Verdict.ERROR
    # a run that could not be made proves nothing for its fault: never counted as caught
    assert judge_matrix(rows + [("reset/live", Verdict.ERROR, Verdict.FAIL)]).verdict is Verdict.INCONCLUSIVE


def _sentinel(**kw):
    from kvdiag.record.sentinel import SentinelBlock, SentinelFinding

    base = dict(source="sentinel.jsonl", starts=1, steps=40, requests=12, reads=9000, writes=800,
                unchecked=0, foreign=0, unwritten=0, overwrite=0)
    findings = kw.pop("findings", [])
    return SentinelBlock(**(base | kw), findings=[SentinelFinding(**f) for f in findings],
                         findings_total=len(findings))


def test_a_sentinel_finding_fails_a_probe_whose_answers_all_matched():
    bad = dict(kind="foreign", step=17, request="cmpl-kvdiag-0123456789abcdef-1", count=32,
               where="lifecycle session 3 round 0", positions=[[64, 96]], context_len=130,
               writers=["cmpl-x"], writers_where=["shared session 1 round 2"],
               context=["resumed after preemption"], writer_context=["finished"])
    judged = judge_probe(evidence(sentinel=_sentinel(foreign=32, findings=[bad])))
    assert judged.verdict is Verdict.FAIL
    for part in ("32 foreign", "lifecycle session 3 round 0", "64-95", "shared session 1 round 2",
                 "finished", "step 17", "resumed after preemption"):
        assert part in judged.reason


def test_a_sentinel_finding_says_which_phases_read_wrong_and_when_the_ground_truth_did():
    """A fault that corrupts whoever allocates next (the free list holds a page twice) reaches
    the isolated twins too: the FAIL names the phases that read wrong, and says the answers'
    ground truth was served wrong K/V. A file read without the run's requests names none."""
    bad = dict(kind="foreign", step=9, request="r", count=40, where="isolated session 2 round 3",
               positions=[[0, 40]], context_len=90)
    twins = judge_probe(evidence(sentinel=_sentinel(foreign=52, by_phase={"isolated": 40, "life": 12},
                                                    isolated_bad=40, findings=[bad])))
    assert twins.verdict is Verdict.FAIL
    assert "read wrong by phase: isolated 40, life 12" in twins.reason
    assert "40 of them read by requests sent isolated" in twins.reason
    shared = judge_probe(evidence(sentinel=_sentinel(foreign=12, by_phase={"shared": 12}, findings=[bad])))
    assert "shared 12" in shared.reason and "sent isolated" not in shared.reason
    alone = judge_probe(evidence(sentinel=_sentinel(foreign=12, by_phase={"unnamed": 12}, findings=[bad])))
    assert "by phase" not in alone.reason


def test_a_sentinel_that_checked_nothing_is_no_evidence_and_a_pass_names_what_it_checked():
    blind = judge_probe(evidence(sentinel=_sentinel(steps=0, requests=0, reads=0, writes=0)))
    assert blind.verdict is Verdict.INCONCLUSIVE and "checked no KV read" in blind.reason
    passed = judge_probe(evidence(sentinel=_sentinel()))
    assert passed.verdict is Verdict.PASS
    assert "40 steps, 12 requests, 9000 KV slot reads checked" in passed.reason
    assert "trusts the workers" in passed.reason
    assert "sentinel" not in judge_probe(evidence()).reason  # none watched: none claimed
    assert "copy-on-write" not in passed.reason
    copied = judge_probe(evidence(sentinel=_sentinel(copies=7)))
    assert copied.verdict is Verdict.PASS and "7 copy-on-write copies followed" in copied.reason


def test_answers_that_departed_under_a_clean_sentinel_fail_and_say_what_it_rules_out():
    """The answers are the witness of output corruption; a sentinel that watched every read
    and saw none bad does not overturn them (vLLM's CPU LoRA ops gave base tokens the adapter's
    delta: real wrong answers, no block reused), but the FAIL says the cache's blocks are
    cleared. A bad read, or no sentinel, claims nothing of the kind."""
    departed = dict(divergences=[("4", 45.0), ("5", 46.0)], answered=20)
    cleared = judge_probe(evidence(sentinel=_sentinel(), **departed))
    assert cleared.verdict is Verdict.FAIL and cleared.details.corrupted == 2
    assert "0 foreign and 0 unwritten of 9000" in cleared.reason
    bad = dict(kind="unwritten", step=3, request="r", count=4, where="shared session 1 round 4",
               positions=[[0, 4]], context_len=10, writers=[], writers_where=[], context=[],
               writer_context=[])
    inside = judge_probe(evidence(sentinel=_sentinel(unwritten=4, findings=[bad]), **departed))
    assert inside.verdict is Verdict.FAIL and "0 foreign and 0 unwritten" not in inside.reason
    assert "0 foreign and 0 unwritten" not in judge_probe(evidence(**departed)).reason
    blind = _sentinel(steps=0, requests=0, reads=0, writes=0)
    assert "0 foreign and 0 unwritten" not in judge_probe(evidence(sentinel=blind, **departed)).reason


def test_the_judge_labels_every_divergence_and_names_where_the_corruption_was():
    """One label per divergence, in its order; the counts and `where` follow those labels, so a
    fault seen only outside the numbered rounds says where it was."""
    divergences = [("3", 0.2), ("3", 5.0), ("lifecycle flood", 9.0), ("differential", 4.0), ("7", 1.5)]
    judged = judge_probe(evidence(divergences=divergences, answered=20))
    labels = judged.details.labels
    assert labels == [classify_divergence(m, 1.0) for _, m in divergences]
    assert judged.details.corrupted == labels.count("corruption") == 4
    assert judged.details.numerics == labels.count("numerics") == 1
    assert judged.details.where.startswith("rounds 3, 7") and "lifecycle flood" in judged.details.where
    only_life = judge_probe(evidence(divergences=[("lifecycle preempt", 6.0)], answered=20))
    assert only_life.verdict is Verdict.FAIL and only_life.details.where == "lifecycle preempt"
    assert "rounds []" not in only_life.reason


def test_prompt_logprob_departures_are_decided_at_judge_time():
    from kvdiag.record.evidence import LogprobPair, PromptLogprobs
    from kvdiag.verdicts import prompt_logprob_departures

    same = LogprobPair(session=0, round=1, shared=[None, [5, -1.0], [6, -2.0]],
                       isolated=[None, [5, -1.1], [6, -2.05]])
    apart = LogprobPair(session=1, round=4, shared=[None, [5, -1.0], [9, -0.2]],
                        isolated=[None, [5, -1.0], [6, -0.3]])
    far = LogprobPair(session=2, round=2, shared=[None, [5, -1.0]], isolated=[None, [5, -4.5]])
    judged = prompt_logprob_departures(PromptLogprobs(pairs=[same, apart, far]), numerics_margin=1.0)
    assert judged.checked == 3 and judged.mismatched == 2
    assert judged.departed == [4, 2] and judged.rounds == [2, 4]
    assert judged.examples[0].first == 2 and judged.examples[1].first == 1
    # the margin is the rule's input: a wider one forgives the 3.5-nat difference too
    assert prompt_logprob_departures(PromptLogprobs(pairs=[far]), numerics_margin=4.0).mismatched == 0
    # a block read back from a summary (no pairs) keeps the counts it was written with
    stored = PromptLogprobs(checked=9, mismatched=1, departed=[3])
    assert prompt_logprob_departures(stored, 1.0) == stored


def test_the_audit_differential_phase_over_hits_are_the_judges():
    from kvdiag.record.audit_section import DifferentialRow
    from kvdiag.verdicts import differential_over_hits

    rows = [DifferentialRow(name="slot 0", cached=16, bound=16), DifferentialRow(name="slot 1", cached=32, bound=16),
            DifferentialRow(name="other salt", cached=None, bound=0)]
    over, findings = differential_over_hits(rows)
    assert over == 1
    assert "1 of 3 requests" in findings[0] and "slot 1: 32 cached, bound 16" in findings[0]
    assert differential_over_hits(rows[:1]) == (0, [])


def test_runners_measure_and_never_import_the_verdicts():
    """Statistics first, decision once: no module under kvdiag/runners/ imports kvdiag.verdicts,
    so no label (divergence class, over-hit, logprob departure, leak) is applied at measurement."""
    offenders = []
    for path in sorted((ROOT / "kvdiag" / "runners").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [f"kvdiag.{a.name}" for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module == "kvdiag" for a in n.names]
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in imported if m.startswith("kvdiag.verdicts")]
    assert not offenders, "runners that judge:\n" + "\n".join(offenders)
