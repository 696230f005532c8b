"""The sentinel: kvdiag's provenance ledger inside a live engine, so every read of a KV slot
that another prefix wrote (foreign), or that nothing wrote (unwritten), is seen at the step it
happens, under the engine's real scheduling (preemption, chunked prefill, backlog, cancels).

    ledger.py     the engine-agnostic ledger: writes, then reads, per step
    log.py        the append-only file it writes (findings, counters) and its reader
    reference.py  the same ledger on the reference engine (kvdiag serve --sentinel)
    (engines/vllm/sentinel.py is the hook into vLLM's v1 scheduler, installed by its plugin)

Imports only numpy and reference_engine.provenance: it runs inside an engine's own env.
"""
