"""The coverage table's rows for the slot events' phase (slotlife.py): what the rows a run
stored say of each event, reached or not, and why."""

from __future__ import annotations

from kvdiag.runners.live.lifeplan import LifePlan
from kvdiag.runners.live.oracle import lcp
from kvdiag.runners.live.slotlife import PINNED, children_sets
from kvdiag.vocab import CHUNK_REUSE, FAILED_RESTORE


def coverage_rows(by_group: dict[str, list[dict]], life: LifePlan, observed: dict, row) -> list[dict]:
    """The slot events' rows of the coverage table (`row`: events.py's row maker)."""
    reuse = [_reuse(by_group, life, row)] if life.sizing.get("reuse_chunk") else []
    if life.sizing.get("failed_restore"):
        reuse.append(_failed_restore(by_group, life, observed, row))
    if "restore" in life.skipped:
        why = f"not driven: {life.skipped['restore']}"
        return [_ram_cache(by_group, life, row), row("slot-restore", False, why, 0),
                row("slot-erase", False, why, 0), _children(by_group, life, observed, row), *reuse]
    return [_ram_cache(by_group, life, row), _restore(by_group, observed, row),
            _erase(by_group, observed, row), _children(by_group, life, observed, row), *reuse]


def _reuse(by_group: dict, life: LifePlan, row) -> dict:
    """Reached where a request sent after its pasted version reported more cached tokens than
    the two share: its tail came back as a shifted chunk."""
    if "reuse" in life.skipped:
        return row(CHUNK_REUSE, False, f"not driven: {life.skipped['reuse']}", 0)
    rows = {r["session"]: r for r in by_group.get("reuse", [])}
    shifted = []
    for q in life.group("reuse"):
        if q.of is not None and q.j in rows:
            past = (rows[q.j].get("cached_tokens") or 0) - lcp(life.requests[q.of].ids, q.ids)
            if past > 0:
                shifted.append(past)
    asked = sum(q.of is not None for q in life.group("reuse"))
    return row(CHUNK_REUSE, bool(shifted),
               f"{asked} conversations on slot {PINNED}, each with a span of another pasted after its "
               f"first quarter, then without it (n_cache_reuse {life.sizing['reuse_chunk']}): {len(shifted)} "
               f"reported cached tokens past what the two share (most {max(shifted, default=0)}): a chunk "
               "shifted back over the span. Their answers have no isolated twin (the chunk's K/V were "
               "computed after the span, approximate by design): only kvdiag's sentinel inside the "
               "server judges their reads (on in the builds kvdiag makes; --sentinel on for the stock one)",
               len(rows), {"shifted": len(shifted)})


def _failed_restore(by_group: dict, life: LifePlan, observed: dict, row) -> dict:
    """Reached where the broken file's restore was refused and the slot's conversation was asked
    again after it (its cached tokens say whether the server cleared the slot: a cleared one
    reports none)."""
    if "failed-restore" in life.skipped:
        return row(FAILED_RESTORE, False, f"not driven: {life.skipped['failed-restore']}", 0)
    actions = observed.get("failed_restore") or []
    rows = sorted(by_group.get("failed-restore", []), key=lambda r: r["index"])
    save = next((a for a in actions if a["action"] == "save"), None)
    restore = next((a for a in actions if a["action"] == "restore"), None)
    if save is None or not save.get("ok"):
        why = save.get("error", "no answer") if save else "never asked"
        return row(FAILED_RESTORE, False, f"not driven: slot {PINNED} was not saved ({why})", len(rows))
    if restore is None:
        return row(FAILED_RESTORE, False, "not driven: the saved slot file's layout is not one kvdiag "
                   "knows how to break (the engine's version differs)", len(rows))
    if restore.get("ok"):
        return row(FAILED_RESTORE, False, "not driven: the broken file's restore was taken whole "
                   f"({restore.get('n_restored')} tokens)", len(rows))
    after = [r.get("cached_tokens") for r in rows[2:]]
    return row(FAILED_RESTORE, len(rows) == 3,
               f"slot {PINNED} saved with the longer conversation, a copy of its file broken after "
               f"its keys, the slot given to the other; the copy's restore refused "
               f"({str(restore.get('error'))[:80]}); the other "
               f"then asked again, reporting {after} cached tokens (a slot cleared after the failed "
               "load reports none)", len(rows), {"cached_after": after[0] if after else None})


def _ram_cache(by_group: dict, life: LifePlan, row) -> dict:
    """Reached where a returning request reported more cached tokens than it shares with
    any request sent since its own last round: those took every slot (one at a time, each
    to the least recently used slot, which llama-server picks for a prompt that matches no
    slot), so its hit came back from the RAM prompt cache. The pinned round is told apart:
    a request pinned to a slot goes another way through slot selection."""
    if "rotate" in life.skipped:
        return row("ram-cache", False, f"not driven: {life.skipped['rotate']}", 0)
    slots = life.sizing.get("slots")
    rows = by_group.get("rotate", []) + by_group.get("pinned", [])
    restored = {"rotate": [], "pinned": []}
    returning = {"rotate": 0, "pinned": 0}
    sent = [life.requests[r["session"]] for r in sorted(rows, key=lambda r: r["index"])]
    for r in rows:
        q = life.requests[r["session"]]
        if q.of is None:
            continue
        between = sent[sent.index(life.requests[q.of]) + 1:sent.index(q)]
        returning[q.group] += 1
        if (r.get("cached_tokens") or 0) > max((lcp(p.ids, q.ids) for p in between), default=0):
            restored[q.group].append(r["cached_tokens"])
    hit, pinned = restored["rotate"], restored["pinned"]
    return row("ram-cache", bool(hit), f"{slots + 1} conversations through {slots} slots, one request "
               f"at a time: {len(hit)} of {returning['rotate']} returning requests reported more cached "
               f"tokens than they share with the {slots} requests sent since their last round (most "
               f"{max(hit, default=0)}): restored from the RAM prompt cache; pinned to a slot (id_slot), "
               f"{len(pinned)} of {returning['pinned']} did", len(rows),
               {"restored": len(hit), "restored_pinned": len(pinned)})


def _restore(by_group: dict, observed: dict, row) -> dict:
    actions = observed.get("slot_actions", [])
    refused = next((a for a in actions if not a.get("ok")), None)
    rows = by_group.get("restore", [])
    restores = [a for a in actions if a["action"] == "restore" and a.get("ok")]
    if refused and refused["action"] == "save":
        return row("slot-restore", False, f"not driven: the server refused to save slot {PINNED} "
                   f"({refused.get('error', 'no answer')}); llama-server saves slots only when "
                   "started with --slot-save-path", len(rows))
    after = [r.get("cached_tokens") for r in rows[2:]]
    return row("slot-restore", len(restores) == 2 and len(rows) == 4,
               f"slot {PINNED} saved with conversation A, given to B, A's file restored "
               f"{len(restores)} times ({', '.join(str(a.get('n_restored')) for a in restores) or 'none'} "
               f"tokens); B then A asked again after a restore, reporting {after} cached tokens",
               len(rows), {"restores": len(restores),
                           "restored_tokens": max((a.get("n_restored") or 0 for a in restores), default=0)})


def _erase(by_group: dict, observed: dict, row) -> dict:
    erased = [a for a in observed.get("slot_actions", []) if a["action"] == "erase"]
    rows = by_group.get("erase", [])
    if not erased:
        return row("slot-erase", False, "not driven: the slot was never saved and restored", 0)
    ok = erased[0].get("ok") and bool(rows)
    return row("slot-erase", ok, f"slot {PINNED} erased ({erased[0].get('n_erased', erased[0].get('error'))}"
               f"), then A asked again: {[r.get('cached_tokens') for r in rows]} cached tokens", len(rows))


def _children(by_group: dict, life: LifePlan, observed: dict, row) -> dict:
    """Reached where a parent's request for n completions answered n: its n - 1 children ran
    in the other slots (llama-server takes such a request only with n slots free), which held
    shorter prompts of other conversations just before."""
    if "children" in life.skipped:
        return row("n-children", False, f"not driven: {life.skipped['children']}", 0)
    sets = children_sets(life)
    rows = by_group.get("children", [])
    answered = observed.get("children_answered") or []
    if not sets or not answered:
        return row("n-children", False, "not driven: no request for n completions was sent", len(rows))
    n = len(sets[0][1])
    full = [a for a in answered if a == n > 1]
    return row("n-children", bool(full),
               f"{len(answered)} requests for {n} completions on slot {PINNED}, each after the other slots "
               f"were given prompts of other conversations ending before it: {len(full)} answered all {n}, "
               f"{sum(a - 1 for a in full)} answers by children continuing from its cells copied into "
               "those slots", len(rows), {"children": sum(a - 1 for a in full)})
