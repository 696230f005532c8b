"""What a sentinel's block means for a verdict (kvdiag.record.sentinel): any foreign,
unwritten or overwritten read is a finding; a sentinel that checked no read is no evidence;
a pass says how much it checked and what it trusts."""

from __future__ import annotations

from kvdiag.verdicts.core import Judgement, Verdict


def _first(block) -> str:
    """The first bad read (a foreign or unwritten slot) where there is one, else the first
    overwrite: who, which positions, whose K/V, when, in which event."""
    f = next((f for f in block.findings if f.kind != "overwrite"), block.findings[0])
    span = ", ".join(f"{a}-{b - 1}" for a, b in f.positions[:3])
    who = f.where or f.request
    writer = ((f.writers_where or [None])[0] or f.writers[0]) if f.writers else None
    fate = f.writer_context[0] if f.writer_context else "live"
    event = f" ({'; '.join(f.context)})" if f.context else ""
    if f.kind == "overwrite":
        return (f"first: {who}'s positions {span} overwritten by {writer}{event} at step "
                f"{f.step}")
    held = f", holding K/V of {writer} ({fate})" if writer else ""
    return f"first: {who} read positions {span} {f.kind}{held} at step {f.step}{event}"


def sentinel_finding(block) -> str | None:
    """The FAIL sentence, or None when the sentinel saw nothing wrong (or did not watch)."""
    if block is None or not block.bad:
        return None
    parts = [f"{n} {what}" for n, what in ((block.foreign, "foreign"), (block.unwritten, "unwritten"),
                                           (block.overwrite, "overwritten")) if n]
    named = set(block.by_phase) - {"unnamed"}  # a file read on its own names no phase
    phases = ", ".join(f"{phase} {n}" for phase, n in list(block.by_phase.items())[:6]) if named else ""
    truth = (f"; {block.isolated_bad} of them read by requests sent isolated, so the ground truth "
             "was itself served wrong K/V: any departure of the answers is from twins that may "
             "be the wrong ones" if block.isolated_bad else "")
    return (f"sentinel: {', '.join(parts)} KV slot reads inside the server, in "
            f"{block.findings_total} finding(s) ({_first(block)})"
            + (f"; read wrong by phase: {phases}" if phases else "") + truth)


def sentinel_cleared(block) -> str | None:
    """What a FAIL found by the answers alone adds when the sentinel watched every read and
    saw none bad: the departures are real, but not block reuse as the scheduler declared it.
    None when the sentinel did not watch, checked nothing, or saw a bad read."""
    if block is None or not block.reads or block.bad:
        return None
    return (f"the sentinel saw 0 foreign and 0 unwritten of {block.reads} KV slot reads, so "
            "these departures are not blocks reused across requests as the scheduler declared "
            "them: K/V written under the wrong weights or batch-dependent compute are outside "
            "what it sees (docs/sentinel.md)")


def sentinel_blind(block) -> str | None:
    """The INCONCLUSIVE sentence for a sentinel that checked no read, or None."""
    if block is None or block.reads:
        return None
    return (f"the sentinel ({block.source}) checked no KV read ({block.steps} steps seen): "
            "its evidence is none")


def sentinel_covered(block) -> str:
    """What a PASS says of it."""
    if block is None:
        return ""
    unchecked = f", {block.unchecked} request-steps unchecked" if block.unchecked else ""
    unchecked += f", {block.copies} copy-on-write copies followed" if block.copies else ""
    unchecked += (f", {block.shifted} reads of cells a chunk reuse moved judged by their token, "
                  "not their prefix (their K/V were computed after other tokens, by design)"
                  if block.shifted else "")
    groups = f" in {len(block.groups)} KV cache groups ({', '.join(block.groups)})" \
        if len(block.groups) > 1 else ""
    unseen = (f"; this {block.engine} hands its workers no {', '.join(block.unseen)}, so it "
              "could not follow those" if block.unseen else "")
    return (f"; sentinel: {block.steps} steps, {block.requests} requests, {block.reads} KV slot "
            f"reads checked{groups}, 0 foreign, 0 unwritten{unchecked} ({block.trusts}{unseen})")


def judge_sentinel(block) -> Judgement:
    """A sentinel's file read on its own (kvdiag sentinel): fail on any bad read,
    inconclusive when it checked nothing, pass naming what it checked."""
    if (found := sentinel_finding(block)) is not None:
        return Judgement(Verdict.FAIL, found)
    if (blind := sentinel_blind(block)) is not None:
        return Judgement(Verdict.INCONCLUSIVE, blind)
    return Judgement(Verdict.PASS, sentinel_covered(block).removeprefix("; "))
