"""What a sentinel's block means for a verdict (kvdiag.record.sentinel): any foreign,
unwritten or overwritten read is a finding; a sentinel that checked no read is no evidence;
a pass says how much it checked and what it trusts."""

from __future__ import annotations


def _first(block) -> str:
    f = block.findings[0]
    span = ", ".join(f"{a}-{b - 1}" for a, b in f.positions[:3])
    who = f.where or f.request
    out = f"first: {who} read positions {span} {f.kind}"
    if f.writers:
        writer = f.writers_where[0] or f.writers[0]
        fate = f.writer_context[0] if f.writer_context else "live"
        out += f", written by {writer} ({fate})" if f.kind != "overwrite" else f", overwritten by {writer}"
    out += f" at step {f.step}"
    return out + (f", {'; '.join(f.context)}" if f.context else "")


def sentinel_finding(block) -> str | None:
    """The FAIL sentence, or None when the sentinel saw nothing wrong (or did not watch)."""
    if block is None or not block.bad:
        return None
    parts = [f"{n} {what}" for n, what in ((block.foreign, "foreign"), (block.unwritten, "unwritten"),
                                           (block.overwrite, "overwritten")) if n]
    return (f"sentinel: {', '.join(parts)} KV slot reads inside the server, in "
            f"{block.findings_total} finding(s) ({_first(block)})")


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
    return (f"; sentinel: {block.steps} steps, {block.requests} requests, {block.reads} KV slot "
            f"reads checked, 0 foreign, 0 unwritten{unchecked} ({block.trusts})")
