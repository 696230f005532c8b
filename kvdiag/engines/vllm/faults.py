"""The names of the faults kvdiag can plant into a real vLLM, checked before anything starts
(the catalog, with what each re-creates: catalog.py; the plants themselves: plants/). No
vLLM import here."""

from __future__ import annotations

from kvdiag.engines.vllm.catalog import parse

FAULT_ENV = "KVDIAG_VLLM_FAULT"  # names the fault the plugin plants; unset or empty: inert


def check_fault(name: str | None) -> str | None:
    """The fault as given (NAME or NAME:ARG), or None for none; an unknown name or a bad
    argument raises KvdiagError (exit 2)."""
    if not name:
        return None
    parse(name)
    return name
