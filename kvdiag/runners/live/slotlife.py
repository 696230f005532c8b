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
    failed-   where kvdiag started the server (it can write into    failed-restore: a server
    restore   the slot folder): on one slot, L (the longer of A     that keeps the slot after
              and B), its file saved and a copy broken to fail      the failed load serves S
              partway; S (the other); the copy restored (it must    from the cells it left
              fail, after every layer's keys); S again
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
    reuse     where the server reuses chunks (--cache-reuse N):     chunk-reuse: the tail comes
              on slot 0, a conversation with a span of another      back shifted over the span,
              pasted after its first quarter, then without it       its K/V computed after it:
              and with a few words of another at its end (REUSES    approximate by design, so
              conversations, each made new by a lead-in)            no isolated twin; the
                                                                    sentinel judges the reads

Every prompt is one of the suite's own, so its answer is read from its conversation (a window
cut anywhere is answered from its last few tokens, and a flat next-token distribution would
class any change as numerics).
Pure planning (plan_slots) and the sending (slots_phase); what each row of the coverage
table says is slotrows.py's. The requests are LifeRequests, stored as (LIFE, j, 0) like the
paged engines' lifecycle phase, so the twins, the judge and the tables treat them alike.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

from kvdiag.runners.live.cancel import cancel_request
from kvdiag.runners.live.lifeplan import ANSWER, LIFE, LifePlan, LifeRequest
from kvdiag.vocab import CANCELS

ROUNDS = 3  # rounds of each rotating conversation, before the pinned one
PARENTS = 3  # requests for n completions the children group sends (a last question is often a
# near-tie at its first tokens, where a child's change is numerics: more parents, more chances)
PINNED = 0  # the slot the restore, erase and cancel groups pin their requests to
CUT = 4  # cancel-decode: tokens read before the client goes (of up to 4 x ANSWER)
REUSES = 3  # conversations the reuse group pastes a span into, then sends without it
REUSE_CHUNK = 256  # the --cache-reuse N a run that drives chunk reuse starts llama.cpp with
LEAD = 8  # tokens of another conversation that make each reuse request one never sent before


def plan_slots(sessions: list[list[list[int]]], slots: int | None, reuse_chunk: int = 0, *,
               failed_restore: bool = False) -> LifePlan:
    """The phase's requests for a server of `slots` slots (its /props total_slots; None: not
    reported), from the suite's own conversations (`sessions`: each one's prompts as token
    ids, round by round, each the last one extended): prompts whose answers the model reads
    from the conversation, so wrong cells under them show in the answer. `reuse_chunk`: the
    server's --cache-reuse N (0: it reuses no chunks, and the reuse group is not sent).
    `failed_restore`: kvdiag can write into the server's slot folder (it started the server),
    so the failed-restore group is sent. Pure: a resumed probe plans the same."""
    requests: list[LifeRequest] = []

    def add(group: str, ids: list[int], salt: str, of: int | None = None, twinned: bool = True) -> int:
        requests.append(LifeRequest(len(requests), group, tuple(ids), ANSWER, salt, of=of, twinned=twinned))
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
        if failed_restore:  # the slot's S, read after a failed load of the longer L's file
            longer, other = (a, b) if len(a) >= len(b) else (b, a)
            add("failed-restore", longer, "failed-restore-l")
            s1 = add("failed-restore", other, "failed-restore-s")
            add("failed-restore", other, "failed-restore-s", s1)
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
        if failed_restore:
            skipped["failed-restore"] = skipped["restore"]
    for k, event in enumerate(CANCELS):  # conversations other than A and B where there are
        if sessions:
            add(event, sessions[(2 + k) % len(sessions)][-1], f"cancel-{k}")
    if reuse_chunk > 0:
        _plan_reuse(sessions, reuse_chunk, add, skipped)
    return LifePlan(tuple(requests), skipped, {"slots": slots, "pinned_slot": PINNED, "rounds": rounds,
                                                "reuse_chunk": reuse_chunk, "failed_restore": failed_restore},
                    kind="slots")


def _plan_reuse(sessions: list[list[list[int]]], chunk: int, add, skipped: dict) -> None:
    """The reuse group: for a conversation's last prompt X, its first quarter H, then a short
    lead-in L of another conversation (so that neither request was ever sent: an earlier
    round's X in the RAM prompt cache would be restored instead), then a span S as long as H,
    then the rest T: H + L + S + T, then H + L + T + C, C words of the other conversation
    before L. T sits in the slot after S, a chunk at least `chunk` long, which llama.cpp
    shifts back over S; it ends where the two prompts part (the slot holds the first answer
    after T, the prompt C), so a chunk matched past that point moves a cell the prompt does
    not have. The second request has no twin: its chunk's K/V were computed after S,
    approximate by design."""
    sent = 0
    for c, talk in enumerate(sessions[:REUSES] if len(sessions) >= 2 else []):
        x, other = talk[-1], sessions[(c + 1) % len(sessions)][-1]
        q = len(x) // 4
        mid = len(other) // 2
        close, lead, span = other[mid - 2 * LEAD:mid - LEAD], other[mid - LEAD:mid], other[mid:mid + q]
        if len(x) - q < chunk or len(span) < q or mid < 2 * LEAD:
            continue
        pasted = add("reuse", [*x[:q], *lead, *span, *x[q:]], f"reuse-{c}-pasted")
        add("reuse", [*x[:q], *lead, *x[q:], *close], f"reuse-{c}", of=pasted, twinned=False)
        sent += 1
    if not sent:
        skipped["reuse"] = (f"no conversation's last three quarters are {chunk} tokens or more "
                            "(--cache-reuse N reuses no shorter chunk)")


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

    async def act(action: str, name: str | None = None, into: list | None = None) -> bool:
        got = await asyncio.to_thread(endpoint.slot_action, PINNED, action, name)
        (actions if into is None else into).append({"action": action, "file": name} | got)
        return got.get("ok", False)

    for q in life.group("rotate"):
        await one(q)
    slots = life.sizing.get("slots") or 1
    for c, q in enumerate(life.group("pinned")):
        await one(q, c % slots)
    await _restore_and_erase(life, store, one, act)
    await _failed_restore(life, store, one, act, endpoint, observed)
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
    for q in life.group("reuse"):  # each pasted prompt, then the same without its span
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


async def _failed_restore(life: LifePlan, store, one, act, endpoint, observed: dict) -> None:
    """L on the slot, its file saved, then a broken copy written beside it (in the folder of a
    server kvdiag started), which fails partway through its restore (the engine's protocol
    knows its files); S; the broken copy restored, refused; S again. Its slot actions go to
    `observed["failed_restore"]`, apart from the restore group's."""
    folder = endpoint.slot_files
    group = life.group("failed-restore")
    if not group or folder is None or all((LIFE, q.j, 0) in store.done for q in group):
        return
    longer, first, again = group
    actions = observed.setdefault("failed_restore", [])
    name = f"kvdiag-{uuid.uuid4().hex[:12]}.bin"
    await one(longer, PINNED)
    if not await act("save", name, actions):
        return  # no slot save path (coverage_rows says why)
    saved = Path(folder) / name
    broken = endpoint.protocol.broken_slot_file(saved.read_bytes())
    if broken is None:  # coverage_rows says the file's layout was not known
        return
    bad = saved.with_name(f"{saved.stem}-broken.bin")
    bad.write_bytes(broken)
    await one(first, PINNED)
    await act("restore", bad.name, actions)
    await one(again, PINNED)
