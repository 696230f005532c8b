"""The lifecycle phase for an engine of fixed slots over one cache keyed by tokens only
(llama.cpp's llama-server): no salts to keep requests apart, so instead of the paged
engines' flood it drives the events of a slot's life, one request at a time, each later
checked against its isolated twin (`cache_prompt: false`) with the isolated phase:

    group     what is sent                                          the event it drives
    rotate    the suite's conversations, one more than the server   ram-cache: every slot went
              has slots, round after round in turn (each prompt     to another conversation
              the last extended, unevenly, as the suite grows)      since a conversation's last
                                                                    round, so a hit beyond what
                                                                    they share is a prompt
                                                                    restored from the RAM cache
    pinned    their last round, each pinned to a slot (id_slot)     ram-cache, through a pinned
                                                                    slot's selection
    restore   on one slot (id_slot): A, then the slot saved to a    slot-restore: B asks for
              file; B; A's file restored; B again (the slot's       what the slot held before
              cells are A's now); A's file restored; A again         the restore (a server that
              (A and B: two conversations' last prompts)            keeps the old token list
                                                                    serves B from A's cells);
                                                                    A reads the restored cells
    erase     the slot erased, then A again                         slot-erase
    children  for B and the next two conversations (P): every       n-children: every child's
              slot but 0 given a prompt of another conversation     slot copies P's cells over
              at once, the longest that ends (with its answer)      a shorter prompt's (a child
              before P does; then P asking for one completion per   that keeps those answers P
              slot (n), on slot 0: its children take those slots,   from both, nearest its
              each answer judged against P's twin                   question)
    cancel-   a conversation's last prompt streamed on slot 0, its  cancel-prefill, cancel-decode:
    prefill,  client gone before its first token (prefill) or       the same prompt reads the
    decode    after CUT tokens (decode); then the same prompt on    cells a cancelled task left
              slot 0 again                                          in its slot

Every prompt is one of the suite's own, so its answer is read from its conversation (a window
cut anywhere is answered from its last few tokens, and a flat next-token distribution would
class any change as numerics).
Pure planning (plan_slots) and the sending (slots_phase); what each row of the coverage
table says is coverage_rows'. The requests are LifeRequests, stored as (LIFE, j, 0) like the
paged engines' lifecycle phase, so the twins, the judge and the tables treat them alike.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from kvdiag.runners.live.cancel import cancel_request
from kvdiag.runners.live.lifeplan import ANSWER, LIFE, LifePlan, LifeRequest
from kvdiag.vocab import CANCELS

ROUNDS = 3  # rounds of each rotating conversation, before the pinned one
PARENTS = 3  # requests for n completions the children group sends (a last question is often a
# near-tie at its first tokens, where a child's change is numerics: more parents, more chances)
PINNED = 0  # the slot the restore, erase and cancel groups pin their requests to
CUT = 4  # cancel-decode: tokens read before the client goes (of up to 4 x ANSWER)


def plan_slots(sessions: list[list[list[int]]], slots: int | None) -> LifePlan:
    """The phase's requests for a server of `slots` slots (its /props total_slots; None: not
    reported), from the suite's own conversations (`sessions`: each one's prompts as token
    ids, round by round, each the last one extended): prompts whose answers the model reads
    from the conversation, so wrong cells under them show in the answer. Pure: a resumed
    probe plans the same."""
    requests: list[LifeRequest] = []

    def add(group: str, ids: list[int], salt: str, of: int | None = None) -> int:
        requests.append(LifeRequest(len(requests), group, tuple(ids), ANSWER, salt, of=of))
        return len(requests) - 1

    skipped = {}
    rounds = min(ROUNDS + 1, min((len(s) for s in sessions), default=0))
    if not slots or slots < 1:
        skipped["rotate"] = "the server does not report its slots (/props total_slots)"
    elif len(sessions) <= slots or rounds < 2:
        skipped["rotate"] = (f"the suite has {len(sessions)} conversations of {rounds} rounds; "
                             f"{slots} slots need {slots + 1} of 2 or more")
    else:
        talks = sessions[:slots + 1]
        last: list[int | None] = [None] * len(talks)
        for r in range(rounds):  # the last round pinned, each to a slot of its own
            for c, prompts in enumerate(talks):
                group = "rotate" if r < rounds - 1 or rounds == 2 else "pinned"
                last[c] = add(group, prompts[r], f"rotate-{c}", last[c])
    if len(sessions) >= 2:
        a, b = sessions[0][-1], sessions[1][-1]
        a1 = add("restore", a, "restore-a")
        b1 = add("restore", b, "restore-b")
        add("restore", b, "restore-b", b1)
        a2 = add("restore", a, "restore-a", a1)
        add("erase", a, "restore-a", a2)
        if not slots or slots < 2:
            skipped["children"] = "the server has one slot (or does not say): no child has a slot of its own"
        else:
            for p in sorted({(1 + i) % len(sessions) for i in range(PARENTS)}):
                parent = sessions[p][-1]
                # prompts that end, with their answers, before the parent does (one that ran
                # past it would put a cell where the parent's next token goes, which llama.cpp's
                # batch check refuses: loud), the longest, so their cells lie near its question
                fits = sorted({tuple(x) for c, s in enumerate(sessions) if c != p for x in s
                               if len(x) + ANSWER < len(parent)}, key=lambda x: (-len(x), x))
                if len(fits) < slots - 1:
                    continue
                for k, held in enumerate(fits[:slots - 1]):
                    add("children", held, f"children-{p}-held-{k + 1}")
                for c in range(slots):  # the parent's n completions, one stored per choice
                    add("children", parent, f"children-{p}-{c}")
            if not any(q.group == "children" for q in requests):
                skipped["children"] = f"the suite has too few prompts shorter than its last ones to hold {slots - 1} slots"
    else:
        skipped["restore"] = skipped["erase"] = skipped["children"] = "the suite has fewer than 2 conversations"
    for k, event in enumerate(CANCELS):  # conversations other than A and B where there are
        if sessions:
            add(event, sessions[(2 + k) % len(sessions)][-1], f"cancel-{k}")
    return LifePlan(tuple(requests), skipped, {"slots": slots, "pinned_slot": PINNED,
                                                "rounds": rounds}, kind="slots")


async def slots_phase(endpoint, life: LifePlan, store, tick: Callable[[], None],
                      observed: dict) -> None:
    """Send the plan one request at a time (the order is the event: which slot a request
    lands on, what the slot held before); the slot actions between, their answers kept in
    `observed["slot_actions"]` (a server without a slot save path refuses them, and the
    groups that need them are then not sent)."""
    actions = observed.setdefault("slot_actions", [])

    async def one(q: LifeRequest, slot: int | None = None) -> None:
        if (LIFE, q.j, 0) in store.done:
            return
        res = await endpoint.complete(list(q.ids), q.max_tokens, cache_salt=None, id_slot=slot)
        store.add(LIFE, q.j, 0, res, group=q.group, salt=q.salt, **({"slot": slot} if slot is not None else {}))
        tick()

    async def act(action: str, name: str | None = None) -> bool:
        got = await asyncio.to_thread(endpoint.slot_action, PINNED, action, name)
        actions.append({"action": action, "file": name} | got)
        return got.get("ok", False)

    for q in life.group("rotate"):
        await one(q)
    slots = life.sizing.get("slots") or 1
    for c, q in enumerate(life.group("pinned")):
        await one(q, c % slots)
    await _restore_and_erase(life, store, one, act)
    answered = observed.setdefault("children_answered", [])
    for held, children in children_sets(life):
        if all((LIFE, q.j, 0) in store.done for q in children):
            continue
        # every other slot holds a shorter prompt, all sent at once: a task that starts
        # while a slot is idle empties it (idle-slot caching), one still running is kept
        await asyncio.gather(*(one(q, k + 1) for k, q in enumerate(held)))
        answers = await endpoint.complete_n(list(children[0].ids), children[0].max_tokens,
                                            len(children), id_slot=PINNED)
        answered.append(len(answers))
        for q, res in zip(children, answers):
            store.add(LIFE, q.j, 0, res, group=q.group, salt=q.salt, slot=PINNED)
            tick()
    for q in life.group(CANCELS[0]) + life.group(CANCELS[1]):
        if (LIFE, q.j, 0) in store.done:
            continue
        # a task the server goes on with until it finds its client gone: the same prompt,
        # pinned to the slot after it, waits for the slot and reads what the task left there
        await cancel_request(endpoint, q, observed, CUT, max_tokens=4 * ANSWER, id_slot=PINNED)
        await one(q, PINNED)


def children_sets(life: LifePlan) -> list[tuple[list[LifeRequest], list[LifeRequest]]]:
    """The children group's (held, children) per parent, in the plan's order."""
    sets: dict[str, tuple[list, list]] = {}
    for q in life.group("children"):
        parent = q.salt.split("-")[1]
        sets.setdefault(parent, ([], []))[1 if "held" not in q.salt else 0].append(q)
    return list(sets.values())


async def _restore_and_erase(life: LifePlan, store, one, act) -> None:
    restore = life.group("restore")
    if not restore or all((LIFE, q.j, 0) in store.done for q in restore + life.group("erase")):
        return
    a1, b1, b2, a2 = restore
    name = f"kvdiag-{uuid.uuid4().hex[:12]}.bin"
    await one(a1, PINNED)
    if not await act("save", name):
        return  # no slot save path: nothing to restore (coverage_rows says why)
    await one(b1, PINNED)
    if await act("restore", name):
        await one(b2, PINNED)
    if await act("restore", name):
        await one(a2, PINNED)
    if await act("erase"):
        for q in life.group("erase"):
            await one(q, PINNED)


def coverage_rows(by_group: dict[str, list[dict]], life: LifePlan, observed: dict, row) -> list[dict]:
    """The slot events' rows of the coverage table (`row`: events.py's row maker)."""
    if "restore" in life.skipped:
        why = f"not driven: {life.skipped['restore']}"
        return [_ram_cache(by_group, life, row), row("slot-restore", False, why, 0),
                row("slot-erase", False, why, 0), _children(by_group, life, observed, row)]
    return [_ram_cache(by_group, life, row), _restore(by_group, observed, row),
            _erase(by_group, observed, row), _children(by_group, life, observed, row)]


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
        if (r.get("cached_tokens") or 0) > max((_common(p.ids, q.ids) for p in between), default=0):
            restored[q.group].append(r["cached_tokens"])
    hit, pinned = restored["rotate"], restored["pinned"]
    return row("ram-cache", bool(hit), f"{slots + 1} conversations through {slots} slots, one request "
               f"at a time: {len(hit)} of {returning['rotate']} returning requests reported more cached "
               f"tokens than they share with the {slots} requests sent since their last round (most "
               f"{max(hit, default=0)}): restored from the RAM prompt cache; pinned to a slot (id_slot), "
               f"{len(pinned)} of {returning['pinned']} did", len(rows),
               {"restored": len(hit), "restored_pinned": len(pinned)})


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


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
