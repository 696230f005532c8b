"""The faults kvdiag plants into llama.cpp's llama-server, by name, each a source patch
(patches/NAME.patch, applied by build.py to a copy of the tree and rebuilt into a binary of
its own) tied to the report whose shape it re-creates.

Data only: a name is checked, and the catalog listed, before anything is built or started.
"""

from __future__ import annotations

from kvdiag.engines.fault import CORRUPTS_OUTPUT, Fault, check_name

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault(
        "prefix-overrun", "prefix match too long (key coverage)",
        "a slot's cached prefix is matched one token past the common prefix, so the first "
        "token that differs is served from the cells of the slot's previous prompt",
        "tools/server/server-context.cpp: the slot's n_past from get_common_prefix",
        ("llama.cpp #12160 / #26676 family: a reused prefix longer than the tokens that match "
         "(cached tokens beyond the common prefix)",),
        (CORRUPTS_OUTPUT,),
        "a request whose prompt shares a prefix with what its slot held before, then differs",
    ),
    Fault(
        "clear-keeps-cells", "cleared slot keeps its cells (lifecycle)",
        "clearing a slot (LRU selection with no RAM-cache match, a purge of idle slots) "
        "empties its token list but leaves its cells in the KV cache, still visible to the "
        "slot's sequence: the next conversation on that slot reports 0 cached tokens and "
        "attends to the previous one's K/V",
        "tools/server/server-context.cpp: server_slot::prompt_clear (seq_rm left out)",
        ("llama.cpp #27148 / PR #27624 (under concurrent load the prompt cache continues an "
         "unrelated finished conversation, cached_tokens 0 in every corrupted reply)",),
        (CORRUPTS_OUTPUT,),
        "more conversations than slots, so a slot is cleared and handed to another one",
        event="recycle",
    ),
)}


def check_fault(name: str | None) -> str | None:
    """The fault name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    return check_name("llama.cpp", FAULTS, name)
