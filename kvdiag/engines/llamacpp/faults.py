"""The faults kvdiag plants into llama.cpp's llama-server, by name, each a source patch
(patches/NAME.patch, applied by build.py to a copy of the tree and rebuilt into a binary of
its own) tied to the report whose shape it re-creates.

Data only: a name is checked, and the catalog listed, before anything is built or started.

A plant tried and dropped: `prompt_clear` without its `seq_rm` (a cleared slot keeping its
cells, the shape of #27148). Measured: 8 new raw-text prompts, each landing on a cleared
slot after six long conversations, departed 0 of 8 times from their twins, as on the stock
build. Read from the source: before every prompt the server truncates the slot's sequence
to its cached prefix again (server-context.cpp, "memory_seq_rm [n_past, end)"), which
removes those cells, so the plant cannot act (docs/llamacpp.md).

`reuse-keeps-span` (`--cache-reuse`'s shift over cells never removed, #12160) was first built
and dropped: the stock build's chunk reuse itself departs from a twin computed from scratch
(a shifted chunk's K/V were computed after a span the new prompt lacks), so answers cannot
tell it. kvdiag's sentinel inside the server can (the cells a chunk reuse moves are told to
it with the token each holds, and a read of one is judged by that token; every other cell by
its prefix), and it is kept, judged by the sentinel (docs/llamacpp.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.engines.fault import CORRUPTS_OUTPUT, Fault, check_name

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault(
        "prefix-overrun", "prefix match too long (key coverage)",
        "a slot's cached prefix is matched one token past the common prefix, so the first "
        "token that differs is served from the cells of the slot's previous prompt",
        "tools/server/server-context.cpp: the slot's n_past from get_common_prefix",
        ("no llama.cpp report: the class of SGLang PR #28692 and Mooncake #4153 (a prefix match "
         "that runs past the common prefix), in llama.cpp's slot reuse",),
        (CORRUPTS_OUTPUT,),
        "a request whose prompt shares a prefix with what its slot held before, then differs",
    ),
    Fault(
        "restore-keeps-tokens", "slot restore keeps the old token list (lifecycle)",
        "POST /slots/ID?action=restore loads the file's cells but leaves the slot's token list "
        "as it was, so the next request matched against that list is served from the restored "
        "conversation's cells: the right key over another conversation's bytes",
        "tools/server/server-context.cpp: SERVER_TASK_TYPE_SLOT_RESTORE",
        ("llama.cpp #26676 (a slot restore whose token list the prompt matcher never sees; "
         "there an under-hit, here the other direction: the matcher sees the old list)",),
        (CORRUPTS_OUTPUT,),
        "a slot saved, given to another conversation, restored, then asked to continue the "
        "conversation it held before the restore",
        event="slot-restore",
    ),
    Fault(
        "state-tail-dropped", "serialized state loses its tail (lifecycle)",
        "a sequence's state, as the RAM prompt cache and slot save take it, has the keys of its "
        "last quarter of cells written as zeros: a prompt restored from it keeps its token list "
        "and its hit, over keys nobody wrote",
        "src/llama-kv-cache.cpp: llama_kv_cache::state_write_data",
        ("no single llama.cpp report: the serialize-restore round trip every cross-slot hit "
         "takes in the default configuration (#27148's path), with bytes lost on the way, as "
         "vLLM's 0.17.1 fix is for blocks read where nothing was written",),
        (CORRUPTS_OUTPUT,),
        "a conversation that returns after its slot went to another, so its prompt comes back "
        "from the RAM prompt cache",
        event="ram-cache",
    ),
    Fault(
        "seq-rm-keeps-cells", "a tail removal leaves its cells visible (lifecycle)",
        "memory_seq_rm over a sequence's tail (from a position past 0) takes the cells out of "
        "the sequence's position index but leaves them in the sequence: the next batch's "
        "positions check out, its tokens are written to other cells at the same positions, and "
        "its queries read both, the bytes the slot held before beside its own",
        "src/llama-kv-cache.cpp: llama_kv_cache::seq_rm",
        ("no single llama.cpp report: the truncation every slot reuse takes (server-context.cpp, "
         "\"memory_seq_rm [n_past, end)\"), the path behind #27148's cleared-but-kept slot, with "
         "the removal itself lost",),
        (CORRUPTS_OUTPUT,),
        "a slot whose next prompt diverges from what it held: another conversation handed the "
        "slot, or a round whose history differs from the tokens the slot generated",
        event="recycle",
    ),
    Fault(
        "failed-load-keeps-slot", "a failed load leaves the slot as it was (lifecycle)",
        "a state load that fails partway (a slot file broken after its keys; a RAM-cache entry, "
        "which no traffic can make fail) neither clears the slot nor removes the cells it placed: the "
        "slot keeps its own token list over the cells and bytes of the conversation it was "
        "loading, and its next request continues that conversation",
        "tools/server/server-context.cpp: SERVER_TASK_TYPE_SLOT_RESTORE's catch, and "
        "src/llama-kv-cache.cpp: state_read_sinfo's state_clear",
        ("llama.cpp #27148's shape as its fix names it (PR #27624: a slot not cleared after a "
         "load finds nothing, so another conversation's state stays in it), with the cleanup "
         "of #27068 (PR #27530: a failed restore's cells and bytes left behind) also left out",),
        (CORRUPTS_OUTPUT,),
        "a slot given a conversation, a restore into it that fails partway (a slot file of a "
        "longer conversation, broken after its keys), then that slot's conversation again",
        event="failed-restore",
    ),
    Fault(
        "child-keeps-cells", "an n > 1 child keeps its slot's cells (lifecycle)",
        "a request for n completions copies its cells into a slot per child without emptying "
        "the child's sequence first: a child whose slot held another prompt reads those cells "
        "beside the parent's",
        "tools/server/server-context.cpp: server_slot::copy_state_to",
        ("no single llama.cpp report: the n_cmpl path (children copied from the parent's state, "
         "server-context.cpp) with the seq_rm every copy into a slot relies on left out",),
        (CORRUPTS_OUTPUT,),
        "a request for n > 1 completions whose children take slots that held other prompts",
        event="n-children",
    ),
    Fault(
        "reuse-keeps-span", "a chunk reuse leaves the span it skips (lifecycle)",
        "with --cache-reuse, a chunk of the slot's cells shifted back to where the new prompt "
        "has it is moved over the cells between its old and new place without removing them: "
        "the prompt reads the skipped span's cells beside the chunk's at the same positions",
        "tools/server/server-context.cpp: the n_cache_reuse loop's seq_rm before seq_add",
        ("llama.cpp #12160 (--cache-reuse's shifted chunks and the cells left around them)",),
        (CORRUPTS_OUTPUT,),
        "a slot holding a prompt with a span pasted in, then asked for the prompt without it, "
        "on a server started with --cache-reuse N",
        live="probe-reuse", event="chunk-reuse",
    ),
    Fault(
        "reuse-match-overrun", "a reused chunk runs one token too long (key coverage)",
        "with --cache-reuse, a chunk of the slot's cells found again in the new prompt is "
        "taken one token past where the two agree: that cell, and its token in the slot's "
        "list, move with the chunk, and the new prompt's own token there is never computed",
        "tools/server/server-context.cpp: the n_cache_reuse loop's n_match",
        ("no llama.cpp report: prefix-overrun's class (SGLang PR #28692, Mooncake #4153) in the "
         "chunk matching of --cache-reuse (#12160's code path)",),
        (CORRUPTS_OUTPUT,),
        "a slot holding a prompt with a span pasted in, then asked for the prompt without it, "
        "on a server started with --cache-reuse N (the lookup of chunk reuse, which the "
        "slot phase's reuse group drives)",
        live="probe-reuse",
    ),
    Fault(
        "adapter-switch-keeps", "an adapter switch keeps the slot (key coverage: the adapter)",
        "a request that names other LoRA adapters than its slot ran keeps the slot's cells, "
        "computed under those adapters: the adapter is no part of what the slot's prefix is "
        "matched on. Planted into the fixed build (adapter-keyed), whose LoRA row passes",
        "tools/server/server-context.cpp: launch_slot_with_task, the lora change's clear",
        ("llama.cpp #26207 (an adapter's K/V reused for another adapter; fixed there for "
         "explicit switches, the path this plant takes back out)",),
        (CORRUPTS_OUTPUT,),
        "the same tokens under the base model, then under the adapter (the differential "
        "phase's adapter pair; the shared phase's rounds alternate)",
        live="probe-adapter", after=("upstream-fixes", "adapter-keyed"),
    ),
)}


@dataclass(frozen=True)
class Fix:
    """An upstream fix not in the pinned build, as a patch (fixes/NAME.patch): built and
    probed like a fault (`llamacpp-local:NAME`), expected to pass; `kvdiag detect` runs only
    the faults."""

    name: str
    summary: str
    reports: tuple[str, ...]  # the pull requests and the issues they fix
    written_from: str  # the PR's diff, or its description where the diff was not at hand
    after: tuple[str, ...] = ()  # fixes whose patches go in first (this one is written on them)


FIXES: dict[str, Fix] = {f.name: f for f in (
    Fix("upstream-fixes",
        "an LRU-selected slot is restored from the RAM prompt cache or cleared, never kept with "
        "another conversation's state; a request pinned to an empty slot, or on a slot holding a "
        "shorter prefix than a cached one, looks the RAM cache up",
        ("PR #27624 (fixes #27148)", "PR #28992 (fixes #28139 and #28276)"),
        "the PRs' descriptions: their diffs were not at hand; the change is written for b11434"),
    Fix("adapter-keyed",
        "the upstream fixes, and: a request that names no LoRA adapter after one that did on its "
        "slot clears the slot, as an explicit switch does; the RAM prompt cache keeps each entry's "
        "adapter scales and restores an entry only to a request under the same ones",
        ("#26207 (its exposures left open: requests without a lora field, RAM-cache entries "
         "keyed by tokens only)",),
        "kvdiag's own change, from the issue and the b11434 source: no upstream PR was at hand",
        after=("upstream-fixes",)),
)}


def check_fault(name: str | None) -> str | None:
    """The fault (or fix) name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    if name in FIXES:
        return name
    return check_name("llama.cpp", FAULTS, name)
